"""Ledger dirs that fail: taken out of service, reported, their ledgers re-replicated (BP-31
"detect and act on ledger disk problems").

Theory of operation
-------------------
The bookie's engine is one :class:`DirShard` per ledger dir under a :class:`LedgerDirs` (the
sharding of ``engines.ShardedEngine``: a ledger lives in the dir it was first written to).
A shard whose engine raises an ``OSError`` that means the device failed (EIO, EROFS, ENXIO,
ENODEV) is **out of service** from then on: every later call on it raises EIO at once, so
reads and writes of its ledgers answer IO_ERROR (never "no such entry": the data may exist),
new ledgers go to the good dirs, and ``sync`` skips it (its data is being re-replicated; a
checkpoint must not stop the whole bookie). Other ``OSError`` s (a transient error without
such an errno) are raised as before.

The first failure calls ``on_failed(dir, ledger ids, good dirs left)`` on the event loop (a
sync in a worker thread may be the one to notice): the bookie logs and counts it, turns
read-only when no good dir is left, and marks every ledger of the dir under-replicated at
once — not at the next periodic check (server_upkeep.py).

Testing only (``engine_fault_injection``): a shard fails every call with EIO once a file named
:data:`INJECT_FILE` exists in its dir.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from engines import ShardedEngine

from ..engine import Engine, LedgerInfo, Record

log = logging.getLogger(__name__)

FAILED_ERRNOS = frozenset({errno.EIO, errno.EROFS, errno.ENXIO, errno.ENODEV})
INJECT_FILE = "INJECT_IO_ERROR"
OnFailed = Callable[[str, list[int], int], None]


class DirShard:
    """One ledger dir's engine, out of service after a device failure (module docstring)."""

    def __init__(self, engine: Engine, directory: str, *, inject: bool = False) -> None:
        self.engine = engine
        self.directory = directory
        self.inject = inject
        self.failed: OSError | None = None
        self.on_fail: Callable[[DirShard], None] = lambda shard: None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.failed is not None:
            raise OSError(errno.EIO, f"ledger dir {self.directory} is out of service")
        try:
            if self.inject and os.path.exists(os.path.join(self.directory, INJECT_FILE)):
                raise OSError(errno.EIO, f"injected I/O error in {self.directory}")
            return fn(*args)
        except OSError as exc:
            self._failing(exc)
            raise

    def _failing(self, exc: OSError) -> None:
        """An engine call raised ``exc``: out of service if it means the device failed."""
        if exc.errno in FAILED_ERRNOS:
            self.failed = exc
            self.on_fail(self)

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        self._call(self.engine.put_entry, ledger_id, entry_id, record)

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        if self.failed is not None or self.inject:
            self._call(self.engine.put_entries, ledger_id, entries, packed, recovery, deferred)
            return
        try:  # _call inlined: once per add request part (a multi-add has up to hundreds)
            self.engine.put_entries(ledger_id, entries, packed, recovery, deferred)
        except OSError as exc:
            self._failing(exc)
            raise

    def write_pressure(self) -> bool:
        return self.failed is None and self.engine.write_pressure()

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._call(self.engine.get_entry, ledger_id, entry_id)

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        # out of service: get_entry raises at once; the injected fault too, in any thread
        return self.failed is not None or self.engine.can_read_now(ledger_id, entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        return self._call(self.engine.last_entry_id, ledger_id)

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        return self._call(self.engine.list_entries, ledger_id, start_entry_id, max_count)

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._call(self.engine.get_ledger, ledger_id)

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        self._call(self.engine.put_ledger, ledger_id, info)

    def delete_ledger(self, ledger_id: int) -> None:
        self._call(self.engine.delete_ledger, ledger_id)

    def ledgers(self) -> list[int]:
        return self._call(self.engine.ledgers)

    def reclaim_space(self, live_ratio_min: float) -> int:
        if self.failed is not None:
            return 0  # out of service: its data is being re-replicated, never rewritten
        return self._call(self.engine.reclaim_space, live_ratio_min)

    def sync(self) -> None:
        if self.failed is None:
            try:
                self._call(self.engine.sync)
            except OSError as exc:
                if exc.errno not in FAILED_ERRNOS:
                    raise  # not a dead device: the checkpoint fails as before

    def close(self) -> None:
        try:
            self.engine.close()
        except OSError as exc:
            if self.failed is None:
                raise
            log.warning("closing failed ledger dir %s: %s", self.directory, exc)


def open_dirs(
    ledger_dirs: Sequence[str], open_one: Callable[[str], Engine], *, inject: bool = False
) -> list[DirShard]:
    """One shard per dir (blocking: run it in a worker thread); closes what it opened if a
    dir fails to open."""
    shards: list[DirShard] = []
    try:
        for d in ledger_dirs:
            shards.append(DirShard(open_one(d), d, inject=inject))
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return shards


class LedgerDirs(ShardedEngine):
    """The bookie's engine over its ledger dirs (see the module docstring)."""

    def __init__(self, shards: Sequence[DirShard]) -> None:
        super().__init__(shards)
        self.dirs = list(shards)
        self.on_failed: OnFailed | None = None
        self._loop = asyncio.get_running_loop()
        for shard in self.dirs:
            shard.on_fail = self._failed

    @property
    def good(self) -> int:
        return sum(shard.failed is None for shard in self.dirs)

    def _shard(self, ledger_id: int) -> Engine:
        shard = self._where.get(ledger_id)
        if shard is None:
            good = [s for s in self.dirs if s.failed is None]
            if not good:
                raise OSError(errno.EIO, "every ledger dir is out of service")
            shard = self._where[ledger_id] = good[ledger_id % len(good)]
        return shard

    def _failed(self, shard: DirShard) -> None:
        # maybe from a worker thread (the checkpoint's, a read's): the ledgers are looked up
        # on the loop, which alone changes the map
        self._loop.call_soon_threadsafe(self._report, shard)

    def _report(self, shard: DirShard) -> None:
        callback = self.on_failed
        if callback is not None:
            ledgers = [lid for lid, s in sorted(self._where.items()) if s is shard]
            callback(shard.directory, ledgers, self.good)

    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "ledger_dirs": len(self.dirs),
            "ledger_dirs_failed": [s.directory for s in self.dirs if s.failed is not None],
            "copy_files_ingested": 0,  # rocksdb: deferred copies ingested as files
            "copy_bytes_ingested": 0,
        }
        for shard in self.dirs:
            engine_stats = getattr(shard.engine, "statistics", None)
            if engine_stats is not None:
                found = engine_stats()
                for key in ("copy_files_ingested", "copy_bytes_ingested"):
                    stats[key] += found.get(key, 0)
        return stats
