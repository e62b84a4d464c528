"""The journal: group commit, durability callbacks, replay, torn tails, checkpoints, failure."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.bookie import journal_files
from bookkeeper_aio.bookie.journal import REC_ENTRIES, REC_ENTRY, REC_FENCE, Journal
from bookkeeper_aio.bookie.journal_format import (
    FILE_HEADER,
    RECORD_HEADER,
    encode_record,
    file_header,
    list_files,
    list_recycled,
    scan,
)
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.errors import JournalFailedError

KiB = 1024


def config(**kw) -> BookieConfig:
    base = dict(journal_preallocate_bytes=64 * KiB, journal_file_bytes_max=6 * 1024 * KiB,
                frame_bytes_max=1024 * KiB, journal_batch_bytes_max=64 * KiB)  # fmt: skip
    return BookieConfig(**{**base, **kw})


async def append_all(j: Journal, records: list[tuple[int, bytes]]) -> list:
    loop = asyncio.get_running_loop()
    futures = []
    for rtype, body in records:
        fut = loop.create_future()
        j.append(rtype, body, lambda exc, f=fut: f.set_result(exc))
        futures.append(fut)
    return await asyncio.gather(*futures)


def replayed(tmp_path, **kw) -> list[tuple[int, bytes]]:
    return [(r.type, r.body) for r in Journal(tmp_path, config(**kw)).replay()]


async def test_records_are_durable_in_order_and_group_committed(tmp_path):
    j = Journal(tmp_path, config())
    await j.start()
    records = [(REC_ENTRY, os.urandom(100) + i.to_bytes(4, "big")) for i in range(2000)]
    order: list[int] = []
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def durable(exc, i):
        order.append(i)
        if i == 1999:
            done.set_result(1)

    for i, (rtype, body) in enumerate(records):
        j.append(rtype, body, lambda exc, i=i: durable(exc, i))
    await done
    stats = j.statistics()
    await j.close()
    assert order == list(range(2000))
    assert stats["fsyncs"] < 200, stats  # thousands of records, few fsyncs: group commit
    assert replayed(tmp_path) == records


async def test_a_body_in_pieces_is_one_record(tmp_path):
    j = Journal(tmp_path, config())
    await j.start()
    pieces = (b"ledger", b"", os.urandom(5000), b"tail")
    assert await append_all(j, [(REC_ENTRIES, pieces), (REC_ENTRY, b"after")]) == [None, None]
    assert j.statistics()["bytes"] == 2 * (RECORD_HEADER.size + 1) + 5010 + 5
    await j.close()
    assert replayed(tmp_path) == [(REC_ENTRIES, b"".join(pieces)), (REC_ENTRY, b"after")]


async def test_batches_respect_the_byte_bound(tmp_path):
    j = Journal(tmp_path, config(journal_batch_bytes_max=16 * KiB))
    await j.start()
    await append_all(j, [(REC_ENTRY, bytes(1 * KiB))] * 160)
    stats = j.statistics()
    await j.close()
    assert stats["batches"] >= 10 and stats["records_per_batch"] <= 16


async def test_torn_tail_replays_the_valid_prefix(tmp_path):
    j = Journal(tmp_path, config())
    await j.start()
    records = [(REC_ENTRY, bytes([i]) * 50) for i in range(10)]
    await append_all(j, records)
    await j.close()
    (_, path), *_ = list_files(tmp_path)
    data = bytearray(path.read_bytes())
    end = scan(bytes(data), 1).end_offset
    data[end - 20 : end] = os.urandom(20)  # corrupt the last record
    path.write_bytes(bytes(data))
    assert replayed(tmp_path) == records[:-1]


async def test_restart_appends_to_a_new_file_and_replay_crosses_files(tmp_path):
    for round_ in range(3):
        j = Journal(tmp_path, config())
        list(j.replay())
        await j.start()
        await append_all(j, [(REC_FENCE, bytes([round_]))])
        await j.close()
    assert len(list_files(tmp_path)) == 3
    assert replayed(tmp_path) == [(REC_FENCE, bytes([r])) for r in range(3)]


@pytest.mark.parametrize("direct", [True, False])
async def test_rollover(tmp_path, direct):
    j = Journal(tmp_path, config(journal_file_bytes_max=1100 * KiB, journal_direct_io=direct))
    await j.start()
    # Records of every size around a block: appends end anywhere inside one.
    records = [(REC_ENTRY, os.urandom(i * 37 % (10 * KiB))) for i in range(300)]
    await append_all(j, records)
    assert j.statistics()["direct_io"] == int(direct)
    await j.close()
    assert len(list_files(tmp_path)) >= 2
    assert replayed(tmp_path) == records


async def test_checkpoint_drops_covered_files_and_records(tmp_path):
    j = Journal(tmp_path, config(journal_file_bytes_max=1100 * KiB))
    await j.start()
    await append_all(j, [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(300)])
    synced = []
    await j.checkpoint(lambda: synced.append(True))
    after = [(REC_ENTRY, b"after-1"), (REC_ENTRY, b"after-2")]
    await append_all(j, after)
    await j.close()
    assert synced == [True]
    assert len(list_files(tmp_path)) == 1
    assert replayed(tmp_path) == after


async def test_checkpoint_recycles_files_and_a_new_file_reuses_one(tmp_path):
    cfg = dict(journal_file_bytes_max=1100 * KiB, journal_recycle_files=1)
    j = Journal(tmp_path, config(**cfg))
    await j.start()
    await append_all(j, [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(300)])
    await j.checkpoint(lambda: None)
    stats = j.statistics()
    assert stats["files_recycled"] == 1 and stats["files_deleted"] >= 1
    (old,) = list_recycled(tmp_path)
    old_size = old.stat().st_size
    await j.close()
    # The next start reuses it: its old records stay on disk behind the new ones and fail
    # the new sequence number's checksum, so replay returns exactly the new records.
    j = Journal(tmp_path, config(**cfg))
    assert list(j.replay()) == []
    await j.start()
    new = [(REC_ENTRY, b"new-%d" % i) for i in range(5)]
    await append_all(j, new)
    assert j.statistics()["files_reused"] == 1 and list_recycled(tmp_path) == []
    await j.close()
    newest = list_files(tmp_path)[-1][1]
    assert newest.stat().st_size == old_size
    assert replayed(tmp_path) == new
    # A torn last record in a reused file: the prefix before it replays.
    data = bytearray(newest.read_bytes())
    end = FILE_HEADER.size + sum(len(encode_record(1, t, b)) for t, b in new)
    data[end - 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert replayed(tmp_path) == new[:-1]


async def test_a_recycled_file_is_never_replayed_until_renamed(tmp_path):
    cfg = dict(journal_file_bytes_max=1100 * KiB)
    j = Journal(tmp_path, config(**cfg))
    await j.start()
    await append_all(j, [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(120)])
    await j.checkpoint(lambda: None)
    await j.close()
    recycled = list_recycled(tmp_path)
    assert recycled
    # A crash between the new header's write and the rename: the file keeps its recycled
    # name and holds a valid header and old records of another file.
    next_seq = list_files(tmp_path)[-1][0] + 1
    stale = recycled[0].read_bytes()
    recycled[0].write_bytes(file_header(next_seq) + stale[FILE_HEADER.size :])
    assert replayed(tmp_path, **cfg) == []


async def test_write_failure_is_fail_stop(tmp_path, monkeypatch):
    failures: list[BaseException] = []
    j = Journal(tmp_path, config(), on_failure=failures.append)
    await j.start()
    await append_all(j, [(REC_ENTRY, b"ok")])

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_files.os, "fdatasync", broken)
    results = await append_all(j, [(REC_ENTRY, b"a"), (REC_ENTRY, b"b")])
    assert all(isinstance(r, JournalFailedError) for r in results)
    assert len(failures) == 1 and j.failed is not None
    with pytest.raises(JournalFailedError):
        j.append(REC_ENTRY, b"c", lambda exc: None)
    monkeypatch.undo()
    await j.close()
    assert replayed(tmp_path)[0] == (REC_ENTRY, b"ok")


def _tail_after(path, records) -> bytes:
    """The bytes of a journal file after ``records`` (its only ones)."""
    end = FILE_HEADER.size + sum(len(encode_record(1, t, b)) for t, b in records)
    return path.read_bytes()[end:]


@pytest.mark.parametrize("mode", ["fallocate", "zeros"])
async def test_new_files_are_preallocated_as_configured(tmp_path, monkeypatch, mode):
    allocated = {"fallocate": 0, "zeros": 0}
    real_fallocate, real_zeros = os.posix_fallocate, journal_files.write_zeros

    def fallocate(fd, offset, length):
        allocated["fallocate"] += length
        real_fallocate(fd, offset, length)

    def zeros(fd, start, end):
        allocated["zeros"] += end - start
        real_zeros(fd, start, end)

    monkeypatch.setattr(journal_files.os, "posix_fallocate", fallocate)
    monkeypatch.setattr(journal_files, "write_zeros", zeros)
    j = Journal(tmp_path, config(journal_preallocate_mode=mode))
    await j.start()
    records = [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(200)]
    await append_all(j, records)
    assert j.statistics()["fallocate"] == (mode == "fallocate")
    await j.close()
    other = "zeros" if mode == "fallocate" else "fallocate"
    assert allocated[mode] >= 2000 * KiB and allocated[other] == 0, allocated
    # What is allocated past the records reads as zeros either way (replay stops there).
    (path,) = [p for _, p in list_files(tmp_path)]
    tail = _tail_after(path, records)
    assert len(tail) >= 32 * KiB and tail == bytes(len(tail))
    assert replayed(tmp_path) == records


async def test_a_file_system_refusing_fallocate_gets_zeros(tmp_path, monkeypatch, caplog):
    def refused(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(journal_files.os, "posix_fallocate", refused)
    j = Journal(tmp_path, config())
    await j.start()
    records = [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(100)]
    with caplog.at_level(logging.WARNING, logger="bookkeeper_aio.bookie.journal_files"):
        assert await append_all(j, records) == [None] * 100
    assert j.statistics()["fallocate"] == 0
    await j.close()
    refusals = [r for r in caplog.records if "refuses fallocate" in r.getMessage()]
    assert len(refusals) == 1  # once, then zeros without asking again
    (path,) = [p for _, p in list_files(tmp_path)]
    tail = _tail_after(path, records)
    assert len(tail) >= 32 * KiB and tail == bytes(len(tail))
    assert replayed(tmp_path) == records


async def test_a_full_disk_at_preallocation_is_fail_stop(tmp_path, monkeypatch):
    failures: list[BaseException] = []
    j = Journal(tmp_path, config(), on_failure=failures.append)
    await j.start()
    assert await append_all(j, [(REC_ENTRY, b"ok")]) == [None]

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_files.os, "posix_fallocate", full)
    results = await append_all(j, [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(20)])
    assert any(isinstance(r, JournalFailedError) for r in results), results
    assert len(failures) == 1 and j.failed is not None
    monkeypatch.undo()
    await j.close()
    assert replayed(tmp_path)[0] == (REC_ENTRY, b"ok")


async def test_pressure_is_reported_above_the_queue_bound(tmp_path):
    events: list[bool] = []
    cfg = config(journal_queue_bytes_max=64 * KiB, journal_batch_bytes_max=16 * KiB)
    j = Journal(tmp_path, cfg, on_pressure=events.append)
    await j.start()
    await append_all(j, [(REC_ENTRY, bytes(8 * KiB))] * 20)
    await j.close()
    assert events == [True, False]


@given(st.lists(st.tuples(st.integers(1, 255), st.binary(max_size=300)), max_size=20),
       st.integers(1, 2**64 - 1))  # fmt: skip
def test_record_encoding_round_trips(records, seq):
    data = file_header(seq) + b"".join(encode_record(seq, t, b) for t, b in records) + bytes(64)
    result = scan(data, seq)
    assert [(r.type, r.body) for r in result.records] == records and result.clean_end
    # A record encoded for another file never validates there.
    if records:
        other = file_header(seq) + encode_record(seq ^ 1, *records[0])
        assert scan(other, seq).records == []


async def test_the_thread_writes_queued_batches_without_the_event_loop(tmp_path):
    # BookKeeper's journal thread: records queued while a batch is written form the next
    # batch, written at once, not when the event loop comes round to hand it over.
    j = Journal(tmp_path, config(journal_batch_bytes_max=16 * KiB))
    await j.start()
    told: list[BaseException | None] = []
    for _ in range(64):  # 64 KiB: at least four batches
        j.append(REC_ENTRY, bytes(1 * KiB), told.append)
    deadline = time.monotonic() + 10
    while j.statistics().get("bytes", 0) < 64 * KiB and time.monotonic() < deadline:
        time.sleep(0.001)  # noqa: ASYNC251 -- blocks the loop: only the journal thread goes on
    stats = j.statistics()
    assert stats["records"] == 64 and stats["batches"] >= 4, stats
    assert told == []  # callbacks run on the event loop, which has not run since
    await asyncio.sleep(0.1)
    assert told == [None] * 64
    async with asyncio.timeout(10):
        await j.close()
    assert not j._thread.is_alive()
    assert len(replayed(tmp_path)) == 64


async def test_close_writes_what_was_appended_before_it(tmp_path):
    j = Journal(tmp_path, config(journal_batch_bytes_max=16 * KiB))
    await j.start()
    told: list[BaseException | None] = []
    records = [(REC_ENTRY, os.urandom(3 * KiB)) for _ in range(40)]
    for rtype, body in records:
        j.append(rtype, body, told.append)
    async with asyncio.timeout(10):
        await asyncio.gather(j.close(), j.close())  # a second close waits too
    assert told == [None] * 40
    with pytest.raises(JournalFailedError):
        j.append(REC_ENTRY, b"late", told.append)
    assert replayed(tmp_path) == records


async def test_close_returns_only_after_the_thread_has_ended(tmp_path, monkeypatch):
    # The thread's last act is telling the loop it ended; if it lingers after that, close()
    # must still wait for it (and only then close the eventfd it wrote to).
    told = Journal._tell_loop

    def lingering(self, item):
        told(self, item)
        if item is None:
            time.sleep(0.3)

    monkeypatch.setattr(Journal, "_tell_loop", lingering)
    j = Journal(tmp_path, config())
    await j.start()
    j.append(REC_ENTRY, b"x", lambda exc: None)
    async with asyncio.timeout(10):
        await j.close()
    assert not j._thread.is_alive()


async def test_a_callback_that_raises_does_not_strand_the_rest_of_its_batch(tmp_path, caplog):
    j = Journal(tmp_path, config())
    await j.start()
    told: list[int] = []

    def broken(exc):
        raise RuntimeError("a broken callback")

    j.append(REC_ENTRY, b"a", lambda exc: told.append(1))
    j.append(REC_ENTRY, b"b", broken)
    j.append(REC_ENTRY, b"c", lambda exc: told.append(3))
    async with asyncio.timeout(10):
        await j.close()
    assert told == [1, 3]
    assert "journal callback failed" in caplog.text
