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
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..config import ClientConfig, MetadataConfig
from ..digest import master_key
from ..errors import IncorrectParameterError, UnauthorizedError
from ..logs.api import LOG_TAG, LogInfo, LogReader, LogRecord, Logs, LogWriter
from ..logs.options import LogOptions, check_name
from ..metadata.model import LedgerMetadata, password_hash, validate_quorums
from ..metadata.store import open_metadata_store
from ..net import Network, client_network
from . import deletion
from .bookie_pool import BookiePool
from .context import ClientContext
from .placement import PlacementPolicy
from .reader import LedgerReader
from .recovery import recover
from .writer import LedgerWriter, WriterState


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
        metrics_registry: Any = None,
    ) -> AsyncIterator[BookKeeper]:
        """Connect to the cluster whose metadata lives at ``uri``. TLS to the bookies when
        ``config.tls_ca_file`` is set; ``metrics_registry`` (a prometheus_client
        ``CollectorRegistry``): the client's metrics are exported there while connected
        (``bookkeeper_client_*``, docs/operations.md).

        Raises:
            MetadataUnavailableError: the metadata store cannot be reached (within its timeout).
            ConfigError: a malformed URI, an invalid ``config``, a TLS file that cannot be read.
        """
        config = config or ClientConfig()
        config.validate()
        rng = rng or random.Random()
        placement = PlacementPolicy(config.min_racks_per_write_quorum, config.strict_placement)
        network = network or client_network(config)
        async with open_metadata_store(uri, metadata_config) as store:
            pool = BookiePool(network, config, rng)
            ctx = ClientContext(config, store, pool, rng, placement, bugs)
            bk = cls(ctx)
            collector = None
            if metrics_registry is not None:
                from ..metrics.client import ClientCollector  # prometheus_client: only if asked

                collector = ClientCollector(bk)
                metrics_registry.register(collector)
            try:
                yield bk
            finally:
                if collector is not None:
                    metrics_registry.unregister(collector)
                await bk._shutdown()

    def statistics(self) -> dict[str, Any]:
        """What this client did and holds: adds completed, ensemble changes, recoveries
        (counters since connect), pending adds and open writers now, add latency (sampled:
        quantile upper bounds in seconds), its bookie connections and metadata calls."""
        writers = list(self._writers)
        latency = self.ctx.stats.add_latency
        return {
            **self.ctx.stats.counters,
            "pending_adds": sum(w._pipe.pending_count for w in writers),
            "writers_open": sum(1 for w in writers if w.state is WriterState.OPEN),
            "add_latency_s_p50": latency.quantile(0.5),
            "add_latency_s_p99": latency.quantile(0.99),
            "bookies": self.ctx.pool.statistics(),
            "metadata": self.ctx.metadata.statistics(),
        }

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
        ctime_ms = self.ctx.wall_clock_ms()  # metadata timestamp only: never used for decisions

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

    async def delete_ledger(self, ledger_id: int, *, owner_log: str | None = None) -> None:
        """Delete a ledger: the one delete path (``client/deletion.py``). Its metadata becomes
        a tombstone by compare-and-swap; each bookie's garbage collector then deletes its data
        (docs/durability.md, "Deleting"). ``owner_log``: only logs pass it, for their own
        ledgers (truncation, retention, delete).

        Raises:
            NoSuchLedgerError: no such ledger (the message says if it was deleted before).
            LedgerOfLogError: the ledger belongs to a log: delete or truncate the log.
            LedgerNotArchivedError: the cluster requires archival and it is not archived.
        """
        await deletion.delete_ledger(
            self.ctx.metadata, ledger_id, log_tag=LOG_TAG, owner_log=owner_log,
            now_ms=self.ctx.wall_clock_ms,  # the tombstone's time, for its TTL
        )  # fmt: skip

    async def mark_archived(self, ledger_id: int) -> None:
        """Set the ledger's archival bit (a backup application, once it has copied the
        ledger); with the cluster's ``require-archival-before-delete`` only archived ledgers
        can be deleted.

        Raises:
            NoSuchLedgerError: no such ledger.
            IncorrectParameterError: the ledger is not closed.
        """
        await deletion.mark_archived(self.ctx.metadata, ledger_id)

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
            self._logs = Logs(self, self.ctx.wall_clock_ms)
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
