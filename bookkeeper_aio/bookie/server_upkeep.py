"""The bookie's upkeep while it serves: its owned background loops (the checkpoint, the disk
monitor, garbage collection) and the ledger dirs that fail (bookie/server.py says how a bookie
runs as a whole).

Owned background loops run beside the connections: the checkpoint loop (sync the engine, trim
the journal), the disk monitor (read-only mode when a ledger dir fills up) and, with a metadata
store, the garbage collector (``gc.py``: deletes tombstoned ledgers, reclaims their space).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..config import BookieConfig
from ..engine import Engine
from ..metadata.store import BookieRegistration, MetadataStore
from .disk import next_read_only
from .gc import GarbageCollector
from .handler import RequestHandler
from .ledger_dirs import LedgerDirs
from .storage import BookieJournal, BookieStorage

log = logging.getLogger(__name__)


class BookieUpkeep:
    """Checkpoints, the disk monitor, garbage collection, the ledger dirs that fail and the
    owned background loops: a part of :class:`~.server.Bookie`, which holds the state."""

    config: BookieConfig
    counters: Counter[str]
    storage: BookieStorage
    metadata: MetadataStore | None
    gc: GarbageCollector | None
    _engine: Engine | None
    _journal: BookieJournal | None
    _handler: RequestHandler | None
    _registration: BookieRegistration | None
    _tasks: list[asyncio.Task[None]]
    _gc_lock: asyncio.Lock
    _checkpoint_turn: asyncio.Lock

    if TYPE_CHECKING:  # server.Bookie's

        @property
        def handler(self) -> RequestHandler: ...

        @property
        def engine(self) -> Engine: ...

        def _fatal(self, exc: BaseException) -> None: ...

    # --- background loops -----------------------------------------------------------------

    def _background(self, loop: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Start an owned background loop; its failure is the bookie's (never lost)."""
        task = asyncio.create_task(loop, name=name)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.critical("background loop %s failed", task.get_name(), exc_info=exc)
        self._fatal(exc)

    async def _checkpoint_loop(self) -> None:
        assert self._journal is not None
        while True:
            await asyncio.sleep(self.config.checkpoint_interval_s)
            try:
                await self.checkpoint()
                self.counters["checkpoints"] += 1
            except Exception as exc:
                self._fatal(exc)
                return

    async def collect_garbage(self) -> dict[str, object]:
        """Run one garbage-collection pass now (``gc.py``) and return its figures (JSON-able):
        ledgers deleted, bytes freed, orphans, tombstones confirmed, removed and expired.

        Raises:
            RuntimeError: the bookie runs without a metadata store (nothing to check against).
            MetadataUnavailableError: the store could not be reached (nothing was deleted
                unless it failed after the listing; the next pass goes on).
        """
        if self.gc is None:
            raise RuntimeError("garbage collection needs a metadata store (metadata_uri)")
        async with self._gc_lock:
            return await self.gc.collect()

    async def checkpoint(self, needed: Callable[[], bool] | None = None) -> None:
        """Sync the engine and drop the journal it covers; the copies stored without the
        journal before it began are durable then (bookie/deferred.py). One at a time, in
        turn: ``needed``, asked when this one's turn comes, can skip it (False: those before
        it did the caller's work: the listings of several copies waiting behind one sync
        share it).

        Raises:
            OSError: the engine sync or the checkpoint file write failed.
        """
        assert self._journal is not None and self._handler is not None
        async with self._checkpoint_turn:
            if needed is not None and not needed():
                return
            # Numbered when it begins, not when it was asked for: the copies stored while it
            # waited its turn are in the engine before its sync, so they are covered too.
            begun = self._handler.deferred.sync_begins()
            await self._journal.checkpoint(self.engine.sync)
            self._handler.deferred.synced(begun)

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval_s)
            try:
                await self.collect_garbage()
            except OSError as exc:  # a checkpoint that failed is the checkpoint loop's business
                log.error("gc pass failed: %s", exc)
            except Exception:  # the store unreachable, say: the next pass tries again
                log.exception("gc pass failed")

    async def _disk_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                await self._check_disks()
            except OSError as exc:
                log.error("disk check failed: %s", exc)
            except Exception:  # e.g. the registry refused the read-only update: try again
                log.exception("disk check failed")

    async def _check_disks(self) -> None:
        cfg, handler = self.config, self.handler
        usage = await self.storage.disk_usage()
        handler.disk_space = (usage.free_bytes, usage.total_bytes)
        read_only = (
            cfg.force_read_only
            or self._no_good_dir()
            or next_read_only(
                handler.read_only,
                usage.used_fraction_max,
                cfg.disk_usage_threshold,
                cfg.disk_usage_lwm_threshold,
            )
        )
        if read_only != handler.read_only:
            log.warning(
                "bookie %s is now %s (disk %.1f%% used)",
                cfg.bookie_id, "read-only" if read_only else "writable",
                100 * usage.used_fraction_max,
            )  # fmt: skip
            handler.read_only = read_only
            if self._registration is not None:
                await self._registration.update(read_only=read_only)

    # --- ledger dirs that fail (BP-31) ------------------------------------------------------

    def _no_good_dir(self) -> bool:
        return isinstance(self._engine, LedgerDirs) and self._engine.good == 0

    def _dir_failed(self, directory: str, ledgers: list[int], good_left: int) -> None:
        """A ledger dir went out of service (ledger_dirs.py): read-only if it was the last
        good one, and its ledgers marked under-replicated now."""
        self.counters["ledger_dirs_failed"] += 1
        log.error("bookie %s: ledger dir %s failed: out of service, %d good dir(s) left; its "
                  "%d ledgers are marked under-replicated", self.config.bookie_id, directory,
                  good_left, len(ledgers))  # fmt: skip
        self._tasks.append(
            asyncio.create_task(self._act_on_dir_failure(ledgers), name="bookie-dir-failed")
        )

    async def _act_on_dir_failure(self, ledgers: list[int]) -> None:
        if self._no_good_dir():
            await self._check_disks()  # read-only now, and registered as such
        if self.metadata is None or not ledgers:
            return
        from .dir_marks import mark_dir_ledgers

        await mark_dir_ledgers(self.metadata, self.config.bookie_id, ledgers)
