"""The rocksdb engine's reads from read threads (Engine.can_read_now, bookie/read_pool.py)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from bookkeeper_aio.protocol import PACKED_ENTRY_PREFIX
from engines.rocksdb import RocksDBEngine
from engines.rocksdb_keys import _Batch

MiB = 1 << 20


def record(ledger_id: int, entry_id: int, size: int = 4096) -> bytes:
    head = b"%d/%d:" % (ledger_id, entry_id)
    return head + bytes([entry_id % 251]) * (size - len(head))


def write(engine: RocksDBEngine, ledger_id: int, first: int, count: int, size: int = 4096) -> None:
    entries = [(i, record(ledger_id, i, size)) for i in range(first, first + count)]
    packed = b"".join(PACKED_ENTRY_PREFIX.pack(i, len(r)) + r for i, r in entries)
    engine.put_entries(ledger_id, entries, packed)


def test_only_a_batch_that_may_be_on_the_disk_is_not_read_now(tmp_path: Path) -> None:
    engine = RocksDBEngine(str(tmp_path), memtable_bytes=MiB)
    try:
        write(engine, 1, 0, 64)  # 256 KiB: in the memtable
        write(engine, 1, 64, 64)
        assert engine.can_read_now(1, 0) and engine.can_read_now(1, 127)
        assert engine.can_read_now(1, 128) and engine.can_read_now(1, -1)  # absent
        assert engine.can_read_now(2, 0)  # an unknown ledger
        for ledger_id in range(2, 5):  # 768 KiB more: ledger 1's first batch a memtable ago
            write(engine, ledger_id, 0, 64)
        assert not engine.can_read_now(1, 0) and not engine.can_read_now(1, 63)
        assert engine.can_read_now(1, 64)
        write(engine, 5, 0, 64)
        assert not engine.can_read_now(1, 64) and engine.can_read_now(5, 0)
        assert engine.get_entry(1, 70) == record(1, 70)  # parsed and cached now
        assert engine.can_read_now(1, 64) and engine.can_read_now(1, 127)
        assert not engine.can_read_now(1, 63)
        engine.put_entry(1, 5, b"re-sent")  # an entry key: read under the lock, Bloom-filtered
        assert engine.get_entry(1, 5) == b"re-sent"
    finally:
        engine.close()
    engine = RocksDBEngine(str(tmp_path), memtable_bytes=MiB)
    try:  # reopened: nothing of what is stored is known to be in memory
        assert not engine.can_read_now(5, 0)
        assert engine.get_entry(5, 10) == record(5, 10) and engine.can_read_now(5, 0)
    finally:
        engine.close()


def test_without_the_wal_a_sync_leaves_nothing_known_to_be_in_memory(tmp_path: Path) -> None:
    engine = RocksDBEngine(str(tmp_path), wal=False, memtable_bytes=8 * MiB)
    try:
        write(engine, 1, 0, 8)
        assert engine.can_read_now(1, 0)
        engine.sync()  # flushes the memtables to SSTs: around the page cache
        assert not engine.can_read_now(1, 0)
        write(engine, 1, 8, 8)
        assert engine.can_read_now(1, 8) and not engine.can_read_now(1, 7)
        assert engine.get_entry(1, 3) == record(1, 3) and engine.get_entry(1, 9) == record(1, 9)
    finally:
        engine.close()


def test_reads_in_threads_see_every_write_while_the_loop_writes_and_deletes(
    tmp_path: Path,
) -> None:
    """Four threads read random entries of old batches (the multi-get outside the lock) while
    this thread writes new ledgers, re-sends entries and deletes a ledger: every read returns
    the entry's record, or None only for the deleted ledger; close waits for the last read."""
    engine = RocksDBEngine(str(tmp_path), memtable_bytes=MiB, batch_cache_bytes=MiB)
    old = list(range(1, 9))
    for ledger_id in old:
        for first in range(0, 256, 32):
            write(engine, ledger_id, first, 32)
    engine.sync()
    deleted = threading.Event()
    stop = threading.Event()
    failures: list[str] = []
    reads = [0]

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            ledger_id, entry_id = rng.choice(old), rng.randrange(256)
            was_deleted = deleted.is_set()
            try:
                got = engine.get_entry(ledger_id, entry_id)
            except AssertionError:  # closed under it: only once stop is set
                if not stop.is_set():
                    failures.append("engine closed while reading")
                return
            want = record(ledger_id, entry_id)
            if got != want and not (ledger_id == 1 and (got is None or was_deleted)):
                failures.append(f"{ledger_id}/{entry_id}: {got[:20] if got else got!r}")
            reads[0] += 1

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    try:
        ledger_id = 100
        # new ledgers, 128 KiB each, flushed as they go, until the readers read enough
        while ledger_id < 140 or reads[0] < 400:
            assert time.monotonic() < deadline, f"only {reads[0]} reads in 30 s"
            write(engine, ledger_id, 0, 32)
            engine.put_entry(ledger_id, 3, record(ledger_id, 3))  # a re-sent add
            if reads[0] >= 100 and not deleted.is_set():
                engine.delete_ledger(1)
                deleted.set()
            ledger_id += 1
        assert engine.get_entry(1, 0) is None
        for new in range(100, ledger_id):
            assert engine.get_entry(new, 31) == record(new, 31)
    finally:
        stop.set()
        engine.close()
        for t in threads:
            t.join(10)
    assert not failures, failures[:5]


def test_a_batch_read_by_two_threads_at_once_is_cached_once(tmp_path: Path) -> None:
    engine = RocksDBEngine(str(tmp_path), memtable_bytes=MiB, batch_cache_bytes=MiB)
    try:
        for ledger_id in range(1, 9):  # 2 MiB: ledger 1 out of the memtables
            write(engine, ledger_id, 0, 64)
        assert not engine.can_read_now(1, 0)
        for _ in range(8):  # as if eight threads had read the batch before any cached it
            engine._parsed.remember(1, 0, engine._parsed.get(1, 0) or _read(engine))
        assert engine._parsed.value_bytes == 64 * (4096 + PACKED_ENTRY_PREFIX.size)
        assert engine.can_read_now(1, 0)
    finally:
        engine.close()


def _read(engine: RocksDBEngine) -> _Batch:
    assert engine.get_entry(1, 0) == record(1, 0)
    batch = engine._parsed.get(1, 0)
    assert batch is not None
    return batch
