"""Storage engines behind :class:`bookkeeper_aio.engine.Engine`: memory, files, rocksdb.

:func:`open_engine` opens one engine per ledger dir and, with several dirs, a
:class:`ShardedEngine` that spreads ledgers over them.
"""

from __future__ import annotations

from collections.abc import Sequence

from bookkeeper_aio.engine import Engine, LedgerInfo, Record
from bookkeeper_aio.errors import ConfigError

ENGINE_NAMES = ("rocksdb", "files", "memory")


def open_engine(
    name: str,
    ledger_dirs: Sequence[str],
    *,
    journaled: bool = False,
    direct_io: bool = True,
    blob_files: bool = False,
    write_behind_bytes: int = 0,
    write_rate_bytes_per_s: int = 0,
    copy_file_bytes: int = 0,
) -> Engine:
    """Open the named engine over ``ledger_dirs`` (one engine per dir, sharded if several).

    ``journaled``: the caller's write-ahead journal holds every write and replays it after a
    crash, so an engine may skip its own (rocksdb: no WAL; ``sync()`` still makes everything
    durable). ``direct_io``: write around the page cache where the dir's file system allows it
    (rocksdb: flushes and compactions; see bookkeeper_aio/direct_io.py). ``blob_files``:
    rocksdb keeps payloads in blob files (engines/rocksdb_options.py); the other engines ignore it.
    ``write_behind_bytes``: rocksdb, journaled only: puts gather in one write batch up to this
    many bytes before they reach the DB (reads write it first); the other engines ignore it.
    ``write_rate_bytes_per_s``: rocksdb: its flushes and compactions write at most this fast
    (0: no limit); the other engines ignore it. ``copy_file_bytes``: rocksdb: deferred-sync
    copies go into SST files of about this many bytes, ingested at ``sync()``
    (engines/copy_files.py; 0: through the memtables); the other engines ignore it.

    Raises:
        ConfigError: unknown engine name or no ledger dir.
        OSError: a dir cannot be created or opened (for example locked by another process).
    """
    if not ledger_dirs:
        raise ConfigError("at least one ledger dir is needed")
    if name == "memory":
        from .memory import MemoryEngine

        return MemoryEngine()
    if name == "files":
        from .files import FilesEngine

        def make(d: str) -> Engine:
            return FilesEngine(d)
    elif name == "rocksdb":
        from .rocksdb import RocksDBEngine

        def make(d: str) -> Engine:
            return RocksDBEngine(d, wal=not journaled, direct_io=direct_io, blob_files=blob_files,
                                 write_behind_bytes=write_behind_bytes,
                                 write_rate_bytes_per_s=write_rate_bytes_per_s,
                                 copy_file_bytes=copy_file_bytes)  # fmt: skip
    else:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
    shards: list[Engine] = []
    try:
        for d in ledger_dirs:
            shards.append(make(d))
    except BaseException:
        for s in shards:
            s.close()
        raise
    return shards[0] if len(shards) == 1 else ShardedEngine(shards)


class ShardedEngine:
    """Spreads ledgers over several engines (one per ledger dir).

    A ledger lives where it was first written; new ledgers go to ``ledger_id % len(shards)``.
    The map is rebuilt from each shard's ledgers on open, so adding a dir never hides a ledger.
    """

    def __init__(self, shards: Sequence[Engine]) -> None:
        assert shards
        self.shards = list(shards)
        self._where: dict[int, Engine] = {}
        for shard in self.shards:
            for lid in shard.ledgers():
                self._where.setdefault(lid, shard)

    def _shard(self, ledger_id: int) -> Engine:
        shard = self._where.get(ledger_id)
        if shard is None:
            shard = self._where[ledger_id] = self.shards[ledger_id % len(self.shards)]
        return shard

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        self._shard(ledger_id).put_entry(ledger_id, entry_id, record)

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        self._shard(ledger_id).put_entries(ledger_id, entries, packed, recovery, deferred)

    def write_pressure(self) -> bool:
        return any(shard.write_pressure() for shard in self.shards)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        shard = self._where.get(ledger_id)
        return shard.get_entry(ledger_id, entry_id) if shard else None

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        shard = self._where.get(ledger_id)
        return shard.can_read_now(ledger_id, entry_id) if shard else True

    def last_entry_id(self, ledger_id: int) -> int:
        shard = self._where.get(ledger_id)
        return shard.last_entry_id(ledger_id) if shard else -1

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        shard = self._where.get(ledger_id)
        return shard.list_entries(ledger_id, start_entry_id, max_count) if shard else []

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        shard = self._where.get(ledger_id)
        return shard.get_ledger(ledger_id) if shard else None

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        self._shard(ledger_id).put_ledger(ledger_id, info)

    def delete_ledger(self, ledger_id: int) -> None:
        shard = self._where.get(ledger_id)
        if shard is not None:  # forgotten only once deleted: a failed dir keeps it held
            shard.delete_ledger(ledger_id)
            del self._where[ledger_id]

    def reclaim_space(self, live_ratio_min: float) -> int:
        return sum(shard.reclaim_space(live_ratio_min) for shard in self.shards)

    def ledgers(self) -> list[int]:
        return sorted(self._where)

    def sync(self) -> None:
        for shard in self.shards:
            shard.sync()

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
