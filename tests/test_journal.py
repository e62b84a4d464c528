"""The journal: group commit, durability callbacks, replay, torn tails, checkpoints, failure."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.bookie import journal as journal_mod
from bookkeeper_aio.bookie.journal import REC_ENTRY, REC_FENCE, Journal
from bookkeeper_aio.bookie.journal_format import encode_record, file_header, list_files, scan
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


async def test_rollover(tmp_path):
    j = Journal(tmp_path, config(journal_file_bytes_max=1100 * KiB))
    await j.start()
    records = [(REC_ENTRY, os.urandom(10 * KiB)) for _ in range(300)]
    await append_all(j, records)
    await j.close()
    assert len(list_files(tmp_path)) >= 3
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


async def test_write_failure_is_fail_stop(tmp_path, monkeypatch):
    failures: list[BaseException] = []
    j = Journal(tmp_path, config(), on_failure=failures.append)
    await j.start()
    await append_all(j, [(REC_ENTRY, b"ok")])

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_mod.os, "fdatasync", broken)
    results = await append_all(j, [(REC_ENTRY, b"a"), (REC_ENTRY, b"b")])
    assert all(isinstance(r, JournalFailedError) for r in results)
    assert len(failures) == 1 and j.failed is not None
    with pytest.raises(JournalFailedError):
        j.append(REC_ENTRY, b"c", lambda exc: None)
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
