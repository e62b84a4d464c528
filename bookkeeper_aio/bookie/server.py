"""A bookie's lifecycle: boot (replay), serve, background loops, clean shutdown.

Theory of operation
-------------------
Boot: open the engine, replay the journal into it (every record after the last checkpoint),
start a new journal file, then checkpoint once so the replayed state is synced and the old
journal files go away. Only then does the bookie listen, so no client ever sees a state that a
replay would still change.

Serving: connections (``connection.py``) feed the :class:`RequestHandler`; owned background
loops run beside them, and backpressure stops every connection reading while the journal or the
engine is behind.

Shutdown (SIGTERM/SIGINT in ``__main__``, or :meth:`Bookie.stop`): stop accepting, stop reading,
checkpoint (the engine holds everything), drain the journal so every pending reply goes out,
close connections, close the engine. A journal failure is fail-stop: the bookie answers
IO_ERROR, stops, and ``__main__`` exits non-zero, because a bookie that cannot make entries
durable must not acknowledge anything. So does a background loop that ends with an error (its
loops log and retry what they expect; anything else is a bug, and the bookie is no longer
what it says) and a shutdown that does not finish within ``shutdown_timeout_s``.

Where each part lives: the connections and their backpressure in ``server_connections.py``;
the background loops (checkpoints, the disk monitor, garbage collection) and the ledger dirs
that fail in ``server_upkeep.py``. :class:`Bookie` is both and the lifecycle: boot, failure and
shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import BookieConfig, ClientConfig, MetadataConfig
from ..engine import Engine
from ..metadata.store import BookieRegistration, MetadataStore, open_metadata_store
from ..net import Network, Server, bookie_network
from .connection import BookieConnection
from .cookie import CookieCheck
from .gc import GarbageCollector
from .handler import RequestHandler
from .integrity import BOOKIE_BUGS, CRASH_KEPT_BUG, DataIntegrity
from .journal import Journal
from .ledger_dirs import LedgerDirs
from .ledger_records import LedgerRecords
from .scrubber import Scrubber
from .server_connections import ConnectionControl
from .server_upkeep import BookieUpkeep
from .storage import BookieJournal, BookieStorage, DiskStorage
from .trace import AddTrace

log = logging.getLogger(__name__)


class Bookie(ConnectionControl, BookieUpkeep):
    """One bookie server. Use :meth:`serve` (``async with``) or :meth:`start`/:meth:`stop`."""

    def __init__(
        self,
        config: BookieConfig,
        *,
        network: Network | None = None,
        engine: Engine | None = None,
        storage: BookieStorage | None = None,
        metadata: MetadataStore | None = None,
        rng: random.Random | None = None,
        bugs: frozenset[str] = frozenset(),
        wall_clock_ms: Callable[[], int] | None = None,
    ) -> None:
        """``network``, ``storage`` and ``metadata`` are seams (the simulator passes its own);
        by default TCP, the configured dirs (with ``engine`` if given) and ``metadata_uri``.
        ``wall_clock_ms``: the garbage collector's clock for tombstone TTLs (the simulator's
        is virtual)."""
        config.validate()
        self.config = config
        self.network = network or bookie_network(config)
        self.storage = storage or DiskStorage(config, engine)
        self.rng = rng or random.Random()
        self.bugs = bugs  # simulator only: BP-46 bug switches (integrity.BOOKIE_BUGS)
        self.integrity: DataIntegrity | None = None
        self.counters: Counter[str] = Counter()
        # In accept order (a dict, not a set: a set's order is the objects' addresses, and the
        # simulator must replay a seed exactly when a crash aborts them in turn).
        self.connections: dict[BookieConnection, None] = {}
        self.failure: BaseException | None = None
        self.stopped = asyncio.Event()  # stop() has begun
        self.closed = asyncio.Event()  # stop() has finished
        self._engine: Engine | None = None
        self._journal: BookieJournal | None = None
        self._handler: RequestHandler | None = None
        self._server: Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._journal_full = False
        self._engine_wait: asyncio.Task[None] | None = None  # while the engine has pressure
        self._stop_task: asyncio.Task[None] | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self.metadata: MetadataStore | None = metadata
        self.instance_id: str | None = None
        self._registration: BookieRegistration | None = None
        self.autorecovery: Any = None  # BP-31 --autorecovery: the in-process service
        self.gc: GarbageCollector | None = None
        self._wall_clock_ms = wall_clock_ms or (lambda: int(time.time() * 1000))
        self._gc_lock = asyncio.Lock()  # one pass at a time (the loop and on-demand passes)
        self._checkpoint_turn = asyncio.Lock()  # checkpoints one at a time, in order
        self.scrubber: Scrubber | None = None  # BP-31 bit rot
        self.records: LedgerRecords | None = None  # BP-31 metadata recovery
        self.http_address: str | None = None  # where the admin API listens (http_listen)

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(cls, config: BookieConfig, **kwargs: Any) -> AsyncIterator[Bookie]:
        """Start a bookie, yield it, stop it."""
        bookie = cls(config, **kwargs)
        await bookie.start()
        try:
            yield bookie
        finally:
            await bookie.stop()

    @property
    def handler(self) -> RequestHandler:
        assert self._handler is not None, "bookie not started"
        return self._handler

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "bookie not started"
        return self._engine

    # --- boot -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open storage, replay the journal, checkpoint, listen.

        Raises:
            OSError: a dir cannot be created or opened (for example locked by another bookie).
            JournalFailedError: the journal is corrupt in a way replay cannot get past.
        """
        cfg = self.config
        if self.metadata is None and cfg.metadata_uri:
            mcfg = MetadataConfig(lease_ttl_s=cfg.lease_ttl_s,
                                  keepalive_interval_s=max(0.5, cfg.lease_ttl_s / 4))  # fmt: skip
            self.metadata = await self._exit_stack.enter_async_context(
                open_metadata_store(cfg.metadata_uri, mcfg)
            )
        cookies = None
        if self.metadata is not None:
            cookies = await self.storage.check_cookies(self.metadata)
            self.instance_id = cookies.instance_id
        self._engine, journal, replayed = await self.storage.open(
            self._journal_pressure, self._fatal
        )
        self._journal = journal
        if isinstance(self._engine, LedgerDirs):
            self._engine.on_failed = self._dir_failed
        self._handler = RequestHandler(self._engine, journal, cfg, on_fatal=self._fatal)
        self._handler.on_engine_pressure = self._engine_pressure
        self._handler.sync_engine = self.checkpoint
        if self.metadata is not None and cfg.ledger_records:
            self.records = LedgerRecords(cfg.bookie_id, self._handler, self.metadata)
            self._handler.on_new_ledger = self.records.learned  # before serving: none missed
        if cfg.trace_dir and isinstance(journal, Journal):  # benchmarks only (bookie/trace.py)
            trace = AddTrace(cfg.trace_dir, cfg.bookie_id, cfg.trace_records_max)
            self._handler.trace = journal.trace = trace
        await self.checkpoint()
        await self._check_disks()
        await self._preboot(cookies)
        await self.storage.mark_running(True)
        self._server = await self.network.start_server(lambda: BookieConnection(self), cfg.listen)
        if self.metadata is not None:
            self._registration = await self.metadata.register_bookie(
                cfg.bookie_id, cfg.bookie_id, cfg.rack, self.handler.read_only,
                cookies.incarnation if cookies is not None else "",
            )  # fmt: skip
        self._tasks = [
            self._background(self._checkpoint_loop(), "bookie-checkpoint"),
            self._background(self._disk_loop(), "bookie-disk-monitor"),
        ]
        if self.metadata is not None:
            self.gc = GarbageCollector(
                cfg, self._engine, self.metadata,
                incarnation=cookies.incarnation if cookies is not None else "",
                forget=self.handler.forget, hold=self.handler.hold_adds,
                checkpoint=self.checkpoint,
                reclaim=lambda ratio: self.storage.reclaim_space(self.engine, ratio),
                wall_clock_ms=self._wall_clock_ms,
            )  # fmt: skip
            if cfg.gc_interval_s > 0:
                self._tasks.append(self._background(self._gc_loop(), "bookie-gc"))
        self._start_scrubber()
        if cfg.autorecovery and self.metadata is not None:
            from ..autorecovery.service import in_bookie  # an optional part of the bookie

            self.autorecovery = await self._exit_stack.enter_async_context(
                in_bookie(cfg, self.metadata, self.network, cfg.bookie_id, self.rng)
            )
        if cfg.http_listen is not None:
            from ..admin_http.bookie import serve_bookie_http  # aiohttp only when asked

            self.http_address = await self._exit_stack.enter_async_context(
                serve_bookie_http(self, cfg.http_listen)
            )
        if self.integrity is not None:
            # With the journal, only a repair (wiped dir, limbo left over) needs checking: once.
            interval = 0.0 if cfg.journal_write_data else cfg.data_integrity_check_interval_s
            self._tasks.append(self._background(self.integrity.run(interval), "bookie-integrity"))
        log.info(
            "bookie %s serving on %s (engine %s, %d journal records replayed)",
            cfg.bookie_id, cfg.listen, cfg.engine, replayed,
        )  # fmt: skip

    def _start_scrubber(self) -> None:
        """The scrubber (and the ledger records' task): repairs need a metadata store (the
        peers of an entry) and connections to peers."""
        ctx = None
        if self.metadata is not None:
            client_config = ClientConfig()
            pool = BookiePool(self.network, client_config, self.rng)
            self._exit_stack.push_async_callback(pool.close)
            ctx = ClientContext(client_config, self.metadata, pool, self.rng, PlacementPolicy(),
                                wall_clock_ms=self._wall_clock_ms)  # fmt: skip
        self.scrubber = Scrubber(self.config, self.handler, ctx, self.records, self.rng)
        self.handler.scrub_control = self.scrubber.control
        self._tasks.append(self._background(self.scrubber.run(), "bookie-scrubber"))
        if self.records is not None:
            self._tasks.append(self._background(self.records.run(), "bookie-ledger-records"))

    async def _preboot(self, cookies: CookieCheck | None) -> None:
        """BP-46 phase one, before serving: after an unclean shutdown without the journal, or
        when a dir lost its cookie (data), fence and put in limbo every open ledger this bookie
        serves, then restamp the cookies (see integrity.py, cookie.py)."""
        cfg = self.config
        if self.metadata is None or cookies is None:
            return
        unclean = not cfg.journal_write_data and await self.storage.unclean_shutdown()
        if unclean and (await self.storage.crash_kept_writes() or CRASH_KEPT_BUG in self.bugs):
            # The same operating system still runs: every write the engine returned from
            # reached its page cache, so nothing acknowledged was lost and no limbo is needed
            # (bookie/storage.py). Limbo after every crash held recoveries up for ever once two
            # crashed bookies of one ensemble waited in it for each other.
            unclean = False
            self.counters["unclean_shutdowns_without_loss"] += 1
            log.warning("bookie %s: unclean shutdown, but the system kept running: "
                        "nothing written was lost, no limbo", cfg.bookie_id)  # fmt: skip
        reasons = [r for r in (cookies.repair, "unclean shutdown" if unclean else None) if r]
        if cfg.journal_write_data and not reasons and not self.handler.limbo_ledgers():
            return
        self.integrity = DataIntegrity(
            cfg, self.handler, self.metadata, self.network, rng=self.rng,
            bugs=self.bugs & BOOKIE_BUGS,
        )  # fmt: skip
        if reasons:
            await self.integrity.preboot("; ".join(reasons))
        if cookies.repair is not None:
            await self.storage.restamp_cookies(self.metadata, cookies)

    # --- failure and shutdown -------------------------------------------------------------

    def _fatal(self, exc: BaseException) -> None:
        """Fail-stop: remember the first failure and stop in the background."""
        if self.failure is None:
            self.failure = exc
            log.critical("bookie %s failed, stopping: %s", self.config.bookie_id, exc)
            self.request_stop()

    def request_stop(self) -> None:
        """Begin :meth:`stop` from a callback (signal handler, failure); ``closed`` tells when
        it is done. The task is owned here and awaited by ``stop`` callers via ``closed``."""
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self.stop(), name="stop")

    def abort(self) -> None:
        """Stop at once without any cleanup, as ``kill -9`` would (the simulator's crash).

        Closes the listener and every connection, cancels the background loops and abandons
        the registration (its lease expires later). Storage is left exactly as it is: the
        caller decides what of it survives.
        """
        self.stopped.set()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()
        for task in self._tasks:
            task.cancel()
        if self._registration is not None:
            self._registration.abandon()
        if self.autorecovery is not None:
            self.autorecovery.abort()
        self.closed.set()

    async def stop(self) -> None:
        """Clean shutdown (idempotent); see the module docstring for the order."""
        if self._server is None:
            return  # never started
        if self.stopped.is_set():
            await self.closed.wait()
            return
        self.stopped.set()
        try:
            await self._stop()
        finally:
            self.closed.set()

    async def _stop(self) -> None:
        assert self._server is not None
        if self._registration is not None:
            try:  # first, so that clients stop choosing this bookie
                await self._registration.unregister()
            except Exception as exc:
                log.warning("could not unregister (the lease will expire): %s", exc)
        self._server.close()
        for conn in list(self.connections):
            conn.pause_reading("shutdown")
        current = asyncio.current_task()
        tasks = [t for t in (*self._tasks, self._engine_wait) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        # A loop's own failure was reported when it ended (_loop_ended); these are cancellations.
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(self.config.shutdown_timeout_s):
                await self._shutdown_storage()
        except TimeoutError:
            error = TimeoutError(f"shutdown took longer than {self.config.shutdown_timeout_s} s")
            log.critical("bookie %s: %s; stopping anyway", self.config.bookie_id, error)
            if self.failure is None:
                self.failure = error  # not a clean shutdown: exit status 1
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        await self._exit_stack.aclose()
        log.info("bookie %s stopped", self.config.bookie_id)

    async def _shutdown_storage(self) -> None:
        assert self._journal is not None and self._engine is not None
        if self.failure is None:
            try:
                await self.checkpoint()
            except Exception as exc:  # still close everything; the journal keeps the data
                log.error("final checkpoint failed: %s", exc)
        await self._journal.close()
        await asyncio.sleep(0)  # let the drained callbacks' replies flush
        if self._handler is not None:  # the reads running in threads end first
            await self._handler.reads.aclose()
        await self.storage.close_engine(self._engine)
        if self.failure is None:
            await self.storage.mark_running(False)  # a clean shutdown: no limbo next boot
        if self.integrity is not None:
            await self.integrity.close()

    def statistics(self) -> dict[str, object]:
        """Counters of the server, the handler and the journal."""
        return {
            **self.counters,
            "connections": len(self.connections),
            "handler": self.handler.statistics(),
            "journal": self._journal.statistics() if self._journal else {},
            "integrity": self.integrity.statistics() if self.integrity else {},
            "autorecovery": self.autorecovery.statistics() if self.autorecovery else {},
            "scrubber": self.scrubber.statistics() if self.scrubber else {},
            "ledger_records": self.records.statistics() if self.records else {},
            "ledger_dirs": self._engine.statistics() if isinstance(self._engine, LedgerDirs)
            else {},
            "gc": self.gc.statistics() if self.gc else {},
        }  # fmt: skip
