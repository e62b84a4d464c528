"""The client facade: ``async with BookKeeper.connect(uri) as bk``.

Theory of operation
-------------------
:meth:`BookKeeper.connect` opens the metadata store and a pool of bookie connections and hands
them, with the config, placement policy and rng, to every ledger handle through one
:class:`~bookkeeper_aio.client.context.ClientContext`. Creating a ledger validates the quorum
sizes before anything is written, picks an ensemble among the writable registered bookies, and
creates the metadata with a creator token (so a retried create cannot make two ledgers).
Opening checks the password against the metadata before touching any bookie.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping

from ..config import ClientConfig, MetadataConfig
from ..digest import master_key
from ..errors import UnauthorizedError
from ..metadata.model import LedgerMetadata, password_hash, validate_quorums
from ..metadata.store import open_metadata_store
from ..net import Network, TcpNetwork
from .bookie_client import BookiePool
from .context import ClientContext
from .placement import PlacementPolicy
from .reader import LedgerReader
from .recovery import recover
from .writer import LedgerWriter


class BookKeeper:
    """A client of one cluster (see the module docstring)."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self._writers: list[LedgerWriter] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        uri: str,
        config: ClientConfig | None = None,
        *,
        metadata_config: MetadataConfig | None = None,
        network: Network | None = None,
        rng: random.Random | None = None,
        bugs: frozenset[str] = frozenset(),
    ) -> AsyncIterator[BookKeeper]:
        """Connect to the cluster whose metadata lives at ``uri``.

        Raises:
            MetadataUnavailableError: the metadata store cannot be reached (within its timeout).
            ConfigError: a malformed URI, or an invalid ``config``.
        """
        config = config or ClientConfig()
        config.validate()
        rng = rng or random.Random()
        placement = PlacementPolicy(config.min_racks_per_write_quorum, config.strict_placement)
        async with open_metadata_store(uri, metadata_config) as store:
            pool = BookiePool(network or TcpNetwork(), config, rng)
            ctx = ClientContext(config, store, pool, rng, placement, bugs)
            bk = cls(ctx)
            try:
                yield bk
            finally:
                await bk._shutdown()

    async def _shutdown(self) -> None:
        for writer in self._writers:
            writer._lac_task.cancel()
        await self.ctx.pool.close()

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerWriter:
        """Create a ledger and open it for writing.

        Raises:
            IncorrectParameterError: not E >= WQ >= AQ >= 1.
            NotEnoughBookiesError: fewer than E writable bookies are registered.
        """
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        bookies = (await self.ctx.metadata.list_bookies()).values()
        ensemble = self.ctx.placement.new_ensemble(
            ensemble_size, write_quorum, bookies, self.ctx.rng
        )
        token = uuid.UUID(int=self.ctx.rng.getrandbits(128)).hex
        ctime_ms = int(time.time() * 1000)  # metadata timestamp only: never used for decisions

        def make(ledger_id: int) -> LedgerMetadata:
            return LedgerMetadata(
                ledger_id, ensemble_size, write_quorum, ack_quorum, ((0, ensemble),),
                password_hash=password_hash(password), ctime_ms=ctime_ms,
                custom_metadata=dict(custom_metadata or {}), creator_token=token,
            )  # fmt: skip

        versioned = await self.ctx.metadata.create_ledger(make)
        writer = LedgerWriter(self.ctx, versioned, master_key(password))
        self._writers.append(writer)
        return writer

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> LedgerReader:
        """Open a ledger for reading; with ``recovery`` fence, recover and close it first.

        Raises:
            NoSuchLedgerError: no such ledger.
            UnauthorizedError: wrong password.
            LedgerRecoveryError: recovery could not decide the end (retry later).
        """
        versioned = await self.ctx.metadata.read_ledger(ledger_id)
        if versioned.value.password_hash != password_hash(password):
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        if recovery and not versioned.value.is_closed:
            versioned = await recover(self.ctx, ledger_id, password)
        reader = LedgerReader(self.ctx, versioned)
        if not reader.is_closed:
            await reader.read_last_add_confirmed()
        return reader

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's metadata; bookies drop its entries when they garbage-collect.

        Raises:
            NoSuchLedgerError: no such ledger.
        """
        await self.ctx.metadata.delete_ledger(ledger_id)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id in the cluster."""
        return [i async for i in self.ctx.metadata.list_ledgers()]


__all__ = ["BookKeeper"]
