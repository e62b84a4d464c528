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
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence

from ..config import ClientConfig, MetadataConfig
from ..digest import master_key
from ..errors import IncorrectParameterError, UnauthorizedError
from ..logs.api import LogInfo, LogReader, LogRecord, Logs, LogWriter
from ..logs.options import LogOptions, check_name
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
        # Writers still open, to stop their explicit-LAC tasks at shutdown: weak, so a closed
        # or failed writer (whose task has ended) is not kept for the client's lifetime.
        self._writers: weakref.WeakSet[LedgerWriter] = weakref.WeakSet()

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
        if self._logs is not None:
            await self._logs.close()  # log writers and readers still open
        for writer in list(self._writers):
            writer._lac_task.cancel()
        await self.ctx.pool.close()

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        guaranteed_write_quorum: bool = False,
    ) -> LedgerWriter:
        """Create a ledger and open it for writing.

        With ``guaranteed_write_quorum`` (kept in the ledger's metadata) every entry of the
        closed ledger, and every entry outside the last segment while it is open, has
        ``write_quorum`` copies; adds are still acknowledged at ``ack_quorum``, but stay in
        the writer's memory until they reach WQ, and :meth:`LedgerWriter.close` waits for
        that (docs/protocol.md, "Guaranteed write quorum").

        Raises:
            IncorrectParameterError: not E >= WQ >= AQ >= 1, or a non-bool option.
            NotEnoughBookiesError: fewer than E writable bookies are registered.
        """
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        if type(guaranteed_write_quorum) is not bool:
            raise IncorrectParameterError("guaranteed_write_quorum must be True or False")
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
                master_key=master_key(password).hex(),
                guaranteed_write_quorum=guaranteed_write_quorum,
            )  # fmt: skip

        versioned = await self.ctx.metadata.create_ledger(make)
        writer = LedgerWriter(self.ctx, versioned, master_key(password))
        self._writers.add(writer)
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

    # --- logs: named logs of chained ledgers (bookkeeper_aio/logs, docs/logs.md) -------------
    # Thin delegations to Logs, whose methods carry the full docstrings.

    _logs: Logs | None = None  # created on first use

    @property
    def logs(self) -> Logs:
        """The logs API of this client."""
        if self._logs is None:
            self._logs = Logs(self)
        return self._logs

    async def create_log(
        self,
        name: str,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        segment_bytes_max: int | None = 64 << 20,
        segment_entries_max: int | None = None,
        segment_age_s: float | None = None,
        retention_s: float | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
    ) -> LogInfo:
        """Create a log (:meth:`Logs.create_log`): a writer rolls over to a new ledger at
        ``segment_entries_max`` records, ``segment_bytes_max`` bytes or ``segment_age_s``
        after its ledger's first record; retention removes whole ledgers from the front,
        older than ``retention_s`` or beyond ``retention_bytes``.

        Raises:
            IncorrectParameterError: an invalid name or option (before etcd is touched).
            LogExistsError: the log exists (and ``exist_ok`` is False).
        """
        check_name(name)  # before the options: a bad name is the first thing to say
        options = LogOptions(
            ensemble_size, write_quorum, ack_quorum, segment_bytes_max, segment_entries_max,
            segment_age_s, retention_s, retention_bytes,
        )  # fmt: skip
        return await self.logs.create_log(name, options, exist_ok=exist_ok)

    def open_log_writer(self, name: str) -> LogWriter:
        """The log's writer; ``async with`` takes the log over (:meth:`Logs.open_log_writer`).

        Raises:
            IncorrectParameterError: an invalid name.
        """
        return self.logs.open_log_writer(name)

    def open_log_reader(self, name: str, from_offset: int = 0) -> LogReader:
        """Records from ``from_offset`` on, waiting for more (:meth:`Logs.open_log_reader`).

        Raises:
            IncorrectParameterError: an invalid name or offset.
        """
        return self.logs.open_log_reader(name, from_offset)

    async def read_log(
        self, name: str, from_offset: int = 0, to_offset: int | None = None
    ) -> list[LogRecord]:
        """Confirmed records ``from_offset..to_offset`` (:meth:`Logs.read_log`).

        Raises:
            NoSuchLogError, LogTruncatedError, IncorrectParameterError.
        """
        return await self.logs.read_log(name, from_offset, to_offset)

    async def commit_log_offset(self, name: str, group: str, offset: int) -> None:
        """Store a group's cursor (:meth:`Logs.commit_log_offset`).

        Raises:
            NoSuchLogError, IncorrectParameterError.
        """
        await self.logs.commit_log_offset(name, group, offset)

    async def committed_log_offset(self, name: str, group: str) -> int | None:
        """A group's cursor, or None (:meth:`Logs.committed_log_offset`).

        Raises:
            NoSuchLogError, IncorrectParameterError.
        """
        return await self.logs.committed_log_offset(name, group)

    async def truncate_log(self, name: str, before_offset: int) -> int:
        """Delete whole ledgers below an offset; the first offset kept (:meth:`Logs.truncate_log`).

        Raises:
            NoSuchLogError, IncorrectParameterError.
        """
        return await self.logs.truncate_log(name, before_offset)

    async def log_info(self, name: str) -> LogInfo:
        """Segments and offsets (:meth:`Logs.log_info`).

        Raises:
            NoSuchLogError.
        """
        return await self.logs.log_info(name)

    async def list_logs(self) -> list[str]:
        """Every log's name (:meth:`Logs.list_logs`)."""
        return await self.logs.list_logs()

    async def delete_log(self, name: str) -> None:
        """Delete a log, its ledgers and cursors (:meth:`Logs.delete_log`).

        Raises:
            NoSuchLogError.
        """
        await self.logs.delete_log(name)

    async def append_ledgers_to_log(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        properties: Mapping[str, str | None] | None = None,
        expected_properties: Mapping[str, str | None] | None = None,
    ) -> range:
        """Append closed ledgers in one compare-and-swap, as a writer taking the log over;
        the offsets they got (:meth:`Logs.append_ledgers_to_log`).

        Raises:
            NoSuchLogError, NoSuchLedgerError, IncorrectParameterError, UnauthorizedError,
            LogFencedError, LogPropertyConflictError.
        """
        return await self.logs.append_ledgers_to_log(
            name, ledger_ids, properties=properties, expected_properties=expected_properties
        )


__all__ = ["BookKeeper"]
