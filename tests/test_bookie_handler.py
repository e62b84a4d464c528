"""The bookie's request handler against the memory engine and a journal the test controls."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import pytest

from bookkeeper_aio.bookie.handler import RequestHandler, to_ranges
from bookkeeper_aio.bookie.journal import (
    REC_ENTRIES,
    REC_FENCE,
    REC_LEDGERS_ENTRIES,
    REC_MASTER_KEY,
)
from bookkeeper_aio.bookie.long_poll import Peer
from bookkeeper_aio.bookie.records import (
    LEDGER_KEY,
    ledgers_entries_record,
    packed,
    replay_into,
    unpack_ledgers_entries,
)
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.digest import LacProof, entry_digest, lac_digest, master_key, payload_digest
from bookkeeper_aio.errors import JournalFailedError, StatusCode
from bookkeeper_aio.histogram import Histogram
from bookkeeper_aio.protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    AddBatchRequest,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    ErrorResponse,
    ListEntriesRequest,
    MultiAddRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
    as_part,
    decode_all,
    encode,
    multi_add_results,
    pack_add_entries,
    unpack_read_entries,
)
from bookkeeper_aio.sandbox import free_port
from engines.memory import MemoryEngine

KEY = master_key(b"pw")
OTHER_KEY = master_key(b"other")
L = 7


class ManualJournal:
    """Records appends; the test decides when they become durable."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, bytes, Callable[[BaseException | None], None]]] = []
        self.durable: list[tuple[int, bytes]] = []

    def append(self, rtype: int, body: bytes, callback) -> None:
        self.pending.append((rtype, body, callback))

    def sync(self, exc: BaseException | None = None) -> None:
        pending, self.pending = self.pending, []
        for rtype, body, cb in pending:
            if exc is None:  # as the journal writes it: pieces joined
                self.durable.append((rtype, b"".join(body) if type(body) is tuple else body))
            cb(exc)


class Harness:
    def __init__(self, engine: MemoryEngine | None = None, **config: object) -> None:
        self.engine = MemoryEngine() if engine is None else engine
        self.journal = ManualJournal()
        self.handler = RequestHandler(self.engine, self.journal, BookieConfig(**config))
        self.replies: list = []
        self.rid = 0

    def send(self, cls, *fields, sync: bool = True, peer=None):
        self.rid += 1
        before = len(self.replies)
        self.handler.handle(cls(self.rid, *fields), self.replies.append, peer)
        if sync:
            self.journal.sync()
        return self.replies[-1] if len(self.replies) > before else None

    def add(self, entry_id: int, payload: bytes = b"x", *, key=KEY, lac=None, flags=0, **kw):
        lac = entry_id - 1 if lac is None else lac
        digest = kw.pop("digest", entry_digest(L, entry_id, lac, payload))
        return self.send(AddRequest, L, entry_id, flags, key, lac, payload, digest, **kw)

    def read(self, entry_id: int, *, flags=0, key=None, previous_lac=-1, timeout_ms=0, **kw):
        return self.send(ReadRequest, L, entry_id, flags, key, previous_lac, timeout_ms, **kw)


def test_add_is_acknowledged_only_after_the_journal_syncs():
    h = Harness()
    assert h.add(0, b"hello", sync=False) is None
    assert [r for r, _, _ in h.journal.pending] == [REC_MASTER_KEY, REC_ENTRIES]
    h.journal.sync()
    assert h.replies[-1].status == StatusCode.OK
    read = h.read(0)
    assert (read.status, read.payload, read.entry_lac) == (StatusCode.OK, b"hello", -1)
    assert read.digest == entry_digest(L, 0, -1, b"hello")


def test_journal_failure_answers_io_error():
    h = Harness()
    h.add(0, sync=False)
    h.journal.sync(OSError("disk gone"))
    assert h.replies[-1].status == StatusCode.IO_ERROR


def batch(h: Harness, entries, *, flags=0, key=KEY, sync=True):
    """entries: (entry_id, payload[, digest]) tuples, each with LAC entry_id - 1."""
    wire = []
    for entry_id, payload, *digest in entries:
        d = digest[0] if digest else entry_digest(L, entry_id, entry_id - 1, payload)
        wire.append((entry_id, entry_id - 1, payload_digest(payload), d, payload))
    return h.send(AddBatchRequest, L, flags, key, pack_add_entries(wire), sync=sync)


def test_a_batch_is_answered_once_after_its_last_entry_is_durable():
    h = Harness()
    assert batch(h, [(0, b"a"), (1, b"b"), (2, b"c")], sync=False) is None
    # One journal record for the whole batch.
    assert [r for r, _, _ in h.journal.pending] == [REC_MASTER_KEY, REC_ENTRIES]
    h.journal.sync()
    (reply,) = h.replies
    assert (reply.status, reply.statuses) == (StatusCode.OK, [StatusCode.OK] * 3)
    assert [h.read(e).payload for e in range(3)] == [b"a", b"b", b"c"]
    # A replay of that record alone stores the same records the handler did.
    replayed = MemoryEngine()
    assert replay_into(replayed, h.journal.durable) == 2
    assert [replayed.get_entry(L, e) for e in range(4)] == [
        *(h.engine.get_entry(L, e) for e in range(3)),
        None,
    ]


def test_a_batch_answers_each_entry_and_stores_only_the_good_ones():
    h = Harness()
    h.add(0)
    bad = entry_digest(L, 2, 1, b"other")
    reply = batch(h, [(1, b"ok"), (2, b"bad", bad), (3, b"ok")])
    assert reply.status == StatusCode.BAD_DIGEST
    assert reply.statuses == [StatusCode.OK, StatusCode.BAD_DIGEST, StatusCode.OK]
    assert h.engine.get_entry(L, 2) is None and h.read(3).payload == b"ok"
    assert batch(h, [(4, b"x")], key=OTHER_KEY).statuses == [StatusCode.UNAUTHORIZED]
    h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY)
    assert batch(h, [(5, b"x"), (6, b"y")]).statuses == [StatusCode.FENCED] * 2
    recovered = batch(h, [(5, b"x"), (6, b"y")], flags=ADD_FLAG_RECOVERY)
    assert recovered.statuses == [StatusCode.OK] * 2


def test_a_batch_journals_the_requests_own_bytes_unless_an_entry_failed():
    h = Harness()
    h.add(0)
    wire = [(e, e - 1, payload_digest(p), entry_digest(L, e, e - 1, p), p)
            for e, p in [(1, b"one"), (2, b"two")]]  # fmt: skip
    packed = pack_add_entries(wire)
    h.send(AddBatchRequest, L, 0, KEY, packed)
    assert h.journal.durable[-1] == (REC_ENTRIES, LEDGER_KEY.pack(L) + packed)
    # With a bad entry the record holds only the stored ones: a replay never stores it.
    batch(h, [(3, b"ok"), (4, b"bad", entry_digest(L, 4, 3, b"other"))])
    replayed = MemoryEngine()
    replay_into(replayed, h.journal.durable)
    assert replayed.get_entry(L, 3) == h.engine.get_entry(L, 3) is not None
    assert replayed.get_entry(L, 4) is None


@pytest.mark.parametrize("cut", [1, 11, 12, 35, 36])
def test_a_batch_whose_entries_do_not_parse_is_refused_whole(cut):
    h = Harness()
    packed = pack_add_entries([(0, -1, payload_digest(b"p"), entry_digest(L, 0, -1, b"p"), b"p")])
    reply = h.send(AddBatchRequest, L, 0, KEY, packed + packed[:cut])
    assert reply.status == StatusCode.BAD_REQUEST and "AddBatchRequest" in reply.message
    assert h.engine.get_ledger(L) is None and h.journal.durable == []
    assert h.add(0).status == StatusCode.OK  # and the handler goes on


def test_a_journal_failure_fails_every_journaled_entry_of_a_batch():
    h = Harness()
    batch(h, [(0, b"a"), (1, b"b")], sync=False)
    h.journal.sync(OSError("disk gone"))
    (reply,) = h.replies
    assert reply.status == StatusCode.IO_ERROR and reply.statuses == [StatusCode.IO_ERROR] * 2


def test_a_multi_add_answers_each_part_as_if_it_had_come_alone_once_all_are_durable():
    h = Harness()
    other = L + 1
    wire = [(0, -1, payload_digest(b"b0"), entry_digest(other, 0, -1, b"b0"), b"b0")]
    parts = [
        as_part(AddRequest(0, L, 0, 0, KEY, -1, b"a0", entry_digest(L, 0, -1, b"a0"))),
        as_part(AddBatchRequest(0, other, 0, KEY, pack_add_entries(wire))),
        [ReadRequest.OP, L, 0, 0, None, -1, 0],  # not an add: refused alone
        as_part(AddRequest(0, L, 1, 0, OTHER_KEY, 0, b"a1", entry_digest(L, 1, 0, b"a1"))),
    ]
    assert h.send(MultiAddRequest, parts, sync=False) is None  # the adds wait for the journal
    h.journal.sync()
    (reply,) = decode_all(encode(h.replies[0]))  # as the client gets it
    assert reply.status == StatusCode.OK
    add, added_batch, refused, unauthorized = multi_add_results(reply)
    assert add == AddResponse(h.rid, StatusCode.OK, L, 0)
    assert (added_batch.status, added_batch.ledger_id, added_batch.statuses) == (
        StatusCode.OK, other, [StatusCode.OK],
    )  # fmt: skip
    assert type(refused) is ErrorResponse and refused.status == StatusCode.BAD_REQUEST
    assert unauthorized == AddResponse(h.rid, StatusCode.UNAUTHORIZED, L, 1)
    assert h.read(0).payload == b"a0" and h.engine.get_entry(other, 0) is not None
    assert h.send(MultiAddRequest, []).results == []  # nothing to add: answered at once


def _multi_parts(ledgers: int) -> list:
    """One single-entry add batch to each of ``ledgers`` ledgers, as a multi's parts."""
    parts = []
    for lid in range(L, L + ledgers):
        wire = [(0, -1, payload_digest(b"p"), entry_digest(lid, 0, -1, b"p"), b"p")]
        parts.append(as_part(AddBatchRequest(0, lid, 0, KEY, pack_add_entries(wire))))
    return parts


def test_a_multi_add_journals_its_stored_parts_as_one_record():
    h = Harness()
    parts = _multi_parts(3)
    parts.insert(
        1, as_part(AddRequest(0, L, 5, 0, OTHER_KEY, 4, b"k", entry_digest(L, 5, 4, b"k")))
    )
    bad = entry_digest(L + 1, 1, 0, b"other")  # a batch of two, one entry corrupt
    wire = [(e, e - 1, payload_digest(b"q"), d, b"q")
            for e, d in [(1, entry_digest(L + 1, 1, 0, b"q")), (2, bad)]]  # fmt: skip
    parts.append(as_part(AddBatchRequest(0, L + 1, 0, KEY, pack_add_entries(wire))))
    parts.append(as_part(AddRequest(0, L + 2, 1, 0, KEY, 0, b"r", entry_digest(L + 2, 1, 0, b"r"))))
    assert h.send(MultiAddRequest, parts, sync=False) is None
    records = [r for r, _, _ in h.journal.pending if r not in (REC_MASTER_KEY,)]
    assert records == [REC_LEDGERS_ENTRIES]  # one, for the parts that stored entries
    h.journal.sync()
    (reply,) = decode_all(encode(h.replies[0]))  # as the client gets it
    statuses = [r.status for r in multi_add_results(reply)]
    assert statuses == [StatusCode.OK, StatusCode.UNAUTHORIZED, StatusCode.OK, StatusCode.OK,
                        StatusCode.BAD_DIGEST, StatusCode.OK]  # fmt: skip
    assert h.handler.add_latency.count == 5  # a latency per journaled part, as if alone
    # A replay stores exactly what the handler did, part by part.
    replayed = MemoryEngine()
    assert replay_into(replayed, h.journal.durable) == 4  # three keys, one entries record
    stored = [(lid, e) for lid in range(L, L + 3) for e in range(6)
              if h.engine.get_entry(lid, e) is not None]  # fmt: skip
    assert stored == [(L, 0), (L + 1, 0), (L + 1, 1), (L + 2, 0), (L + 2, 1)]
    assert [replayed.get_entry(*k) for k in stored] == [h.engine.get_entry(*k) for k in stored]
    assert replayed.get_entry(L + 1, 2) is None and replayed.get_entry(L, 5) is None


def test_a_histogram_observes_many_as_it_observes_one_at_a_time():
    one, many = Histogram(), Histogram()
    for value, times in [(0.0003, 3), (0.02, 1), (7.0, 2), (99.0, 5), (0.0, 0)]:
        for _ in range(times):
            one.observe(value)
        many.observe_many(value, times)
    assert one.counts == many.counts and one.sum == pytest.approx(many.sum)


def test_a_multi_add_whose_journal_write_fails_answers_io_error_for_its_stored_parts():
    h = Harness()
    parts = _multi_parts(2)
    parts.append([ReadRequest.OP, L, 0, 0, None, -1, 0])  # refused alone: keeps its status
    h.send(MultiAddRequest, parts, sync=False)
    h.journal.sync(OSError("disk gone"))
    (reply,) = decode_all(encode(h.replies[0]))  # as the client gets it
    results = multi_add_results(reply)
    assert [r.status for r in results] == [StatusCode.IO_ERROR] * 2 + [StatusCode.BAD_REQUEST]
    assert results[0].statuses == [StatusCode.IO_ERROR]


def test_a_multi_add_meeting_a_failed_journal_answers_every_stored_part_once():
    class FailingJournal(ManualJournal):
        def __init__(self, fail_after: int) -> None:
            super().__init__()
            self.fail_after = fail_after

        def append(self, rtype, body, callback) -> None:
            if rtype == REC_LEDGERS_ENTRIES and not self.fail_after:
                raise JournalFailedError("journal failed: disk gone")
            self.fail_after -= rtype == REC_LEDGERS_ENTRIES
            super().append(rtype, body, callback)

    fatal: list = []
    h = Harness()
    h.journal = h.handler.journal = FailingJournal(fail_after=0)
    h.handler._on_fatal = fatal.append
    h.send(MultiAddRequest, _multi_parts(3), sync=False)
    (reply,) = decode_all(encode(h.replies[0]))  # at once: no part is known durable
    assert [r.status for r in multi_add_results(reply)] == [StatusCode.IO_ERROR] * 3
    assert len(fatal) == 1 and h.handler.statistics()["io_errors"] == 1
    h.journal.sync()  # the ledgers' keys, appended before the failure: no answer of theirs
    assert len(h.replies) == 1


class FlagRecordingEngine(MemoryEngine):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list[int], bool, bool]] = []

    def put_entries(self, ledger_id, entries, packed=None, recovery=False, deferred=False):
        self.calls.append(([e for e, _ in entries], recovery, deferred))
        super().put_entries(ledger_id, entries, packed, recovery, deferred)


def test_the_engine_is_told_which_adds_are_recovery_adds_and_deferred_copies():
    """The rocksdb engine keeps recovery adds (autorecovery's copies) apart, in blob files,
    and writes deferred-sync copies into files it ingests at its sync."""
    h = Harness(FlagRecordingEngine())
    batch(h, [(0, b"a"), (1, b"b")])
    batch(h, [(2, b"c"), (3, b"d")], flags=ADD_FLAG_RECOVERY)
    h.add(4, flags=ADD_FLAG_RECOVERY)
    h.add(5)
    batch(h, [(6, b"e"), (7, b"f")], flags=ADD_FLAG_RECOVERY | ADD_FLAG_DEFERRED_SYNC)
    assert h.engine.calls == [
        ([0, 1], False, False),
        ([2, 3], True, False),
        ([4], True, False),
        ([5], False, False),
        ([6, 7], True, True),
    ]


def test_digest_mismatch_is_rejected_and_nothing_is_stored():
    h = Harness()
    reply = h.add(0, b"payload", digest=entry_digest(L, 0, -1, b"other"))
    assert reply.status == StatusCode.BAD_DIGEST
    assert h.engine.get_ledger(L) is None and h.engine.get_entry(L, 0) is None
    assert h.journal.durable == []


def test_master_key_is_set_by_the_first_add_and_checked_afterwards():
    h = Harness()
    assert h.add(0).status == StatusCode.OK
    assert h.add(1, key=OTHER_KEY).status == StatusCode.UNAUTHORIZED
    assert h.engine.get_entry(L, 1) is None
    assert h.read(0, flags=READ_FLAG_FENCE, key=OTHER_KEY).status == StatusCode.UNAUTHORIZED
    assert h.engine.get_ledger(L).fenced is False


def test_fence_rejects_normal_adds_but_accepts_recovery_adds():
    h = Harness()
    h.add(0)
    fence = h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY)
    assert fence.status == StatusCode.OK and fence.lac_proof.lac == -1
    assert fence.last_entry_id == 0
    assert h.add(1).status == StatusCode.FENCED
    assert h.add(1, flags=ADD_FLAG_RECOVERY).status == StatusCode.OK
    assert h.engine.get_ledger(L).fenced


def test_a_deleted_ledger_is_not_created_again_by_a_late_add():
    # Sim seed 917: a zombie writer's add reached its fenced bookies after GC had deleted the
    # ledger (and its fence with it); the add created the ledger again and was acknowledged,
    # an entry of a ledger closed before it.
    h = Harness(deleted_ledgers_remembered_max=2)
    h.add(0)
    assert h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY).status == StatusCode.OK
    h.handler.forget(L)  # what GC does, then the engine deletes the data
    h.engine.delete_ledger(L)
    assert h.add(1).status == StatusCode.FENCED
    assert h.add(1, flags=ADD_FLAG_RECOVERY).status == StatusCode.NO_SUCH_LEDGER
    assert h.engine.get_ledger(L) is None and h.engine.get_entry(L, 1) is None
    for other in (L + 1, L + 2):  # bounded: the oldest deletes are forgotten first
        h.handler.forget(other)
    assert h.add(1).status == StatusCode.OK


def test_an_extra_copy_deleted_here_takes_copies_again_but_no_writer_adds():
    # The GC deleted this bookie's extra copy of a ledger that lives on: a replication worker
    # may choose this bookie as a target again (refused, its job failed until a restart).
    h = Harness()
    h.add(0)
    h.handler.forget(L, copies_welcome=True)
    h.engine.delete_ledger(L)
    assert h.add(1).status == StatusCode.FENCED  # a writer that outlived it: still refused
    assert h.add(1, flags=ADD_FLAG_RECOVERY).status == StatusCode.OK  # a copy: taken
    assert h.engine.get_entry(L, 1) is not None


def test_fence_reply_waits_for_the_journal():
    h = Harness()
    h.add(0)
    assert h.read(0, flags=READ_FLAG_FENCE, key=KEY, sync=False) is None
    assert [r for r, _, _ in h.journal.pending] == [REC_FENCE]
    # A second fence before the first is durable also waits.
    assert h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY, sync=False) is None
    h.journal.sync()
    assert [r.status for r in h.replies[-2:]] == [StatusCode.OK, StatusCode.OK]
    assert h.replies[-2].payload == b"x"
    # Now durable: a third fence answers at once, without another journal record.
    assert h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY, sync=False).status == StatusCode.OK
    assert h.journal.pending == []


def test_fence_of_an_unknown_ledger_records_it_as_fenced():
    h = Harness()
    reply = h.read(0, flags=READ_FLAG_FENCE, key=KEY)
    assert reply.status == StatusCode.NO_SUCH_ENTRY
    info = h.engine.get_ledger(L)
    assert info.fenced and info.master_key == KEY
    assert h.add(0).status == StatusCode.FENCED


def test_explicit_negatives_and_limbo():
    h = Harness()
    assert h.read(0).status == StatusCode.NO_SUCH_LEDGER
    h.add(0)
    assert h.read(5).status == StatusCode.NO_SUCH_ENTRY
    done: list = []
    h.handler.set_limbo(L, KEY, True, done.append)
    h.journal.sync()
    assert done == [None]
    assert h.read(5).status == StatusCode.UNKNOWN  # never an explicit negative in limbo
    assert h.add(1).status == StatusCode.FENCED  # limbo implies fenced
    h.handler.set_limbo(L, KEY, False, done.append)
    assert h.read(5).status == StatusCode.NO_SUCH_ENTRY
    assert h.engine.get_ledger(L).fenced


def test_a_batch_read_answers_what_single_reads_would():
    h = Harness()
    for i in range(10):
        h.add(i, b"entry %d" % i)

    def batch_read(first, count, *, flags=0, key=None, max_bytes=1 << 20, **kw):
        reply = h.send(ReadBatchRequest, L, first, count, flags, key, max_bytes, **kw)
        assert type(reply) is ReadBatchResponse
        return reply, unpack_read_entries(reply.entries) if reply.status == 0 else []

    reply, got = batch_read(2, 5)
    assert reply.status == StatusCode.OK and reply.end_status == StatusCode.OK
    for entry_id, lac, digest, payload in got:  # each exactly as ReadRequest finds it
        single = h.read(entry_id)
        assert (lac, digest, payload) == (single.entry_lac, single.digest, single.payload)
    assert [g[0] for g in got] == [2, 3, 4, 5, 6]
    # Past the last entry: what the next entry would have answered.
    reply, got = batch_read(8, 5)
    assert [g[0] for g in got] == [8, 9] and reply.end_status == StatusCode.NO_SUCH_ENTRY
    # A byte budget ends it early (one entry at least), with OK: nothing was missing.
    record = 24 + len(b"entry 0")  # a stored record: its header, then the payload
    reply, got = batch_read(0, 10, max_bytes=2 * record)
    assert [g[0] for g in got] == [0, 1] and reply.end_status == StatusCode.OK
    reply, got = batch_read(0, 10, max_bytes=1)
    assert [g[0] for g in got] == [0]
    # The request's own failures.
    assert batch_read(0, 0)[0].status == StatusCode.BAD_REQUEST
    assert batch_read(0, 3, flags=READ_FLAG_LONG_POLL)[0].status == StatusCode.BAD_REQUEST
    assert batch_read(0, 3, key=OTHER_KEY)[0].status == StatusCode.UNAUTHORIZED
    reply = h.send(ReadBatchRequest, L + 1, 0, 3, 0, None, 1 << 20)
    assert reply.status == StatusCode.NO_SUCH_LEDGER
    # A fencing batch read fences first (durably: its answer waits for the journal).
    assert h.send(ReadBatchRequest, L, 0, 3, READ_FLAG_FENCE, KEY, 1 << 20, sync=False) is None
    assert [r for r, _, _ in h.journal.pending] == [REC_FENCE]
    h.journal.sync()
    assert (
        h.replies[-1].status == StatusCode.OK
        and len(unpack_read_entries(h.replies[-1].entries)) == 3
    )
    assert h.add(10).status == StatusCode.FENCED
    # In limbo a missing entry may have existed: UNKNOWN, never an explicit negative.
    h.handler.set_limbo(L, KEY, True, lambda _: None)
    h.journal.sync()
    assert batch_read(9, 3)[0].end_status == StatusCode.UNKNOWN


def test_a_batch_read_is_bounded_by_request_entries_max():
    h = Harness(request_entries_max=4)
    for i in range(10):
        h.add(i)
    reply = h.send(ReadBatchRequest, L, 0, 10, 0, None, 1 << 20)
    assert len(unpack_read_entries(reply.entries)) == 4 and reply.end_status == StatusCode.OK


def test_read_only_rejects_normal_adds_but_accepts_recovery_adds():
    h = Harness(force_read_only=True)
    assert h.add(0).status == StatusCode.READ_ONLY
    assert h.add(0, flags=ADD_FLAG_RECOVERY).status == StatusCode.OK
    info = h.send(BookieInfoRequest)
    assert info.read_only is True


def test_lac_is_piggybacked_and_explicit():
    h = Harness()
    for e in range(3):
        h.add(e)
    lac = h.send(ReadLacRequest, L, 0, None)
    assert lac.lac_proof.lac == 1 and lac.lac_proof.verify(L)
    bad = h.send(WriteLacRequest, L, KEY, 2, lac_digest(L, 3))
    assert bad.status == StatusCode.BAD_DIGEST
    assert h.send(WriteLacRequest, L, KEY, 2, lac_digest(L, 2)).status == StatusCode.OK
    proof = h.send(ReadLacRequest, L, 0, None).lac_proof
    assert proof == LacProof.explicit(L, 2) and proof.verify(L)
    # The cache rebuilt from the engine (a restart) gives the same answer.
    h2 = RequestHandler(h.engine, ManualJournal(), BookieConfig())
    replies: list = []
    h2.handle(ReadLacRequest(1, L, 0, None), replies.append)
    assert replies[0].lac_proof.lac == 2


async def test_long_poll_waits_for_the_lac_to_pass():
    h = Harness()
    h.add(0)
    h.add(1)  # LAC 0
    parked = h.read(1, flags=READ_FLAG_LONG_POLL, previous_lac=0, timeout_ms=5000)
    assert parked is None and h.handler.parked == 1
    h.add(2)  # carries LAC 1: passes previous_lac
    reply = h.replies[-2]
    assert (reply.status, reply.entry_id, reply.payload) == (StatusCode.OK, 1, b"x")
    assert reply.lac_proof.lac == 1 and h.handler.parked == 0


async def test_long_poll_times_out_with_an_empty_answer():
    h = Harness()
    h.add(0)
    assert h.read(1, flags=READ_FLAG_LONG_POLL, previous_lac=-1, timeout_ms=10) is None
    await asyncio.sleep(0.05)
    reply = h.replies[-1]
    assert reply.status == StatusCode.OK and reply.payload is None and h.handler.parked == 0


async def test_long_polls_are_bounded():
    h = Harness(long_poll_parked_max=2)
    h.add(0)
    for _ in range(2):
        assert h.read(1, flags=READ_FLAG_LONG_POLL, previous_lac=-1, timeout_ms=60_000) is None
    refused = h.read(1, flags=READ_FLAG_LONG_POLL, previous_lac=-1, timeout_ms=60_000)
    assert refused.status == StatusCode.TOO_MANY_REQUESTS
    h.read(0, flags=READ_FLAG_FENCE, key=KEY)  # a fence releases parked polls
    assert h.handler.parked == 0
    assert [r.status for r in h.replies[-3:-1]] == [StatusCode.OK, StatusCode.OK]


def test_list_entries_in_ranges_with_pagination():
    h = Harness(list_entries_max=3)
    for e in (0, 1, 2, 5, 6, 9):
        h.add(e, lac=-1)
    first = h.send(ListEntriesRequest, L, 0, 100)
    assert first.ranges == [[0, 2]] and first.next_entry_id == 3
    second = h.send(ListEntriesRequest, L, first.next_entry_id, 100)
    assert second.ranges == [[5, 6], [9, 9]] and second.next_entry_id == 10
    third = h.send(ListEntriesRequest, L, 10, 100)
    assert third.ranges == [] and third.next_entry_id == -1
    assert h.send(ListEntriesRequest, 99, 0, 10).status == StatusCode.NO_SUCH_LEDGER
    assert h.send(ListEntriesRequest, L, 0, 0).status == StatusCode.BAD_REQUEST


DEFERRED = ADD_FLAG_RECOVERY | ADD_FLAG_DEFERRED_SYNC


async def loop_turns(count: int = 10) -> None:
    """Let the listing's task, its sync's task and their callbacks run."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_deferred_sync_copy_is_answered_unjournaled_and_a_listing_syncs_it_first():
    h = Harness()
    h.add(0)  # a writer's add: journaled, then synced by nobody
    reply = batch(h, [(1, b"a"), (2, b"b")], flags=DEFERRED, sync=False)
    assert (reply.status, reply.statuses) == (StatusCode.OK, [StatusCode.OK] * 2)
    assert h.journal.pending == []  # answered with no journal record
    assert h.read(2).payload == b"b"
    assert 2 not in h.engine.disk.entries.get(L, {})  # in the engine, not yet durable
    listed = h.send(ListEntriesRequest, L, 0, 100)
    assert listed.ranges == [[0, 2]]
    assert set(h.engine.disk.entries[L]) == {0, 1, 2}  # synced before the answer
    assert h.handler.statistics()["copies_deferred"] == 2
    syncs = h.engine.disk.syncs
    h.send(ListEntriesRequest, L, 0, 100)  # nothing deferred since: no sync
    assert h.engine.disk.syncs == syncs


def test_deferred_sync_is_refused_on_a_writers_add():
    h = Harness()
    reply = batch(h, [(0, b"a")], flags=ADD_FLAG_DEFERRED_SYNC)
    assert reply.statuses == [StatusCode.BAD_REQUEST]
    assert h.add(1, flags=ADD_FLAG_DEFERRED_SYNC).status == StatusCode.BAD_REQUEST
    assert h.engine.get_entry(L, 0) is None and h.engine.get_entry(L, 1) is None


async def test_a_listing_of_deferred_copies_waits_for_a_sync_that_began_after_them():
    h = Harness()
    syncs: list[asyncio.Future[None]] = []

    async def sync_engine(needed) -> None:  # the bookie's checkpoint, held by the test
        assert needed()  # the listing asks only for what it still needs
        begun = h.handler.deferred.sync_begins()
        syncs.append(asyncio.get_running_loop().create_future())
        await syncs[-1]
        h.engine.sync()
        h.handler.deferred.synced(begun)

    h.handler.sync_engine = sync_engine
    batch(h, [(0, b"a")], flags=DEFERRED)
    assert h.send(ListEntriesRequest, L, 0, 100) is None
    await loop_turns()
    assert len(syncs) == 1
    batch(h, [(1, b"b")], flags=DEFERRED)  # a copy during that sync: it may miss it
    syncs[0].set_result(None)
    await loop_turns()
    assert len(h.replies) == 2 and len(syncs) == 2  # a second sync, for the later copy
    syncs[1].set_result(None)
    await loop_turns()
    assert h.replies[-1].ranges == [[0, 1]]
    assert set(h.engine.disk.entries[L]) == {0, 1}


async def test_a_listing_whose_sync_fails_answers_io_error():
    h = Harness()

    async def sync_engine(needed) -> None:
        raise OSError("sync failed")

    h.handler.sync_engine = sync_engine
    batch(h, [(0, b"a")], flags=DEFERRED)
    h.send(ListEntriesRequest, L, 0, 100)
    await loop_turns()
    assert h.replies[-1].status == StatusCode.IO_ERROR


async def test_a_listing_gives_up_on_a_stuck_sync_with_io_error_and_leaves_it_running():
    h = Harness(list_sync_timeout_s=0.05)
    release = asyncio.Event()
    finished: list[bool] = []

    async def sync_engine(needed) -> None:  # a checkpoint stuck on the disk, then done
        await release.wait()
        finished.append(True)

    h.handler.sync_engine = sync_engine
    batch(h, [(0, b"a")], flags=DEFERRED)
    answered: asyncio.Future = asyncio.get_running_loop().create_future()
    h.handler.handle(ListEntriesRequest(99, L, 0, 100), answered.set_result)
    answer = await asyncio.wait_for(answered, 5)
    assert answer.status == StatusCode.IO_ERROR  # never a listing it cannot vouch for
    assert h.handler.deferred.pending(L)
    release.set()
    await loop_turns()
    assert finished == [True]  # the checkpoint was not cut short by the listing giving up


async def test_listings_waiting_behind_one_checkpoint_share_it(tmp_path):
    """Autorecovery's workers list their targets at once: copies stored before a checkpoint
    began are all covered by it, so the listings queued behind it skip their own syncs (an
    engine flush each) instead of running one after another."""
    config = BookieConfig(listen=f"127.0.0.1:{free_port()}", journal_dir=str(tmp_path / "j"),
                          ledger_dirs=(str(tmp_path / "l"),), engine="memory",
                          checkpoint_interval_s=3600)  # fmt: skip
    async with Bookie.serve(config) as bookie:
        handler, answers = bookie.handler, []
        for lid in range(1, 5):
            wire = [(e, e - 1, payload_digest(b"c"), entry_digest(lid, e, e - 1, b"c"), b"c")
                    for e in range(3)]  # fmt: skip
            handler.handle(AddBatchRequest(lid, lid, DEFERRED, KEY, pack_add_entries(wire)),
                           answers.append)  # fmt: skip
        assert [a.statuses for a in answers] == [[StatusCode.OK] * 3] * 4
        before = bookie.statistics()["journal"]["checkpoints"]
        listings: list = []
        all_in = asyncio.Event()

        def listed(reply) -> None:
            listings.append(reply)
            if len(listings) == 4:
                all_in.set()

        for lid in range(1, 5):
            handler.handle(ListEntriesRequest(10 + lid, lid, 0, 100), listed)
        async with asyncio.timeout(10):
            await all_in.wait()
        assert [r.ranges for r in listings] == [[[0, 2]]] * 4
        assert bookie.statistics()["journal"]["checkpoints"] - before == 1
        assert len(handler.deferred) == 0


@pytest.mark.parametrize("ids", [[], [3], [1, 2, 3], [1, 3, 4, 8]])
def test_to_ranges_covers_exactly_the_ids(ids):
    ranges = to_ranges(ids)
    assert [i for a, b in ranges for i in range(a, b + 1)] == ids


def test_limbo_lac_reads_are_unknown_and_a_lost_key_is_learned_from_a_fence():
    """BP-46: a ledger put in limbo at boot without local data has no master key yet."""
    from bookkeeper_aio.bookie.handler import UNKNOWN_KEY

    h = Harness()
    h.handler.set_limbo(L, UNKNOWN_KEY, True, lambda exc: None)
    h.journal.sync()
    fence = h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY)
    assert fence.status == StatusCode.UNKNOWN  # its LAC may be too low: never a known answer
    assert h.engine.get_ledger(L).master_key == KEY  # learned from the fence
    assert h.send(ReadLacRequest, L, READ_FLAG_FENCE, OTHER_KEY).status == StatusCode.UNAUTHORIZED
    assert h.add(0, flags=ADD_FLAG_RECOVERY).status == StatusCode.OK  # repair can write
    assert h.read(0).status == StatusCode.OK and h.read(1).status == StatusCode.UNKNOWN


def test_without_journal_data_an_add_is_acknowledged_before_any_sync():
    h = Harness(journal_write_data=False, metadata_uri="memory://x")
    reply = h.add(0, b"fast", sync=False)
    assert reply is not None and reply.status == StatusCode.OK
    assert [r for r, _, _ in h.journal.pending] == [REC_MASTER_KEY]  # no entries record
    fence = h.send(ReadLacRequest, L, READ_FLAG_FENCE, KEY, sync=False)
    assert fence is None  # fences still wait for the journal
    h.journal.sync()
    assert h.replies[-1].status == StatusCode.OK


# --- hostile input and failure paths (issue 25) -------------------------------------------


class RefusingEngine(MemoryEngine):
    """An engine whose put_ledger fails (as RocksDB's key packing did for a negative id)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def put_ledger(self, ledger_id, info):
        raise self.error


@pytest.mark.parametrize("error", [struct.error("argument out of range"), OSError(5, "EIO")])
def test_a_fence_the_engine_refuses_is_answered_and_never_remembered(error):
    # The fence must be durable before it is answered OK: a failed one leaves nothing cached,
    # so a second fence does not answer OK from the cache with nothing journaled.
    h = Harness()
    h.handler.engine = RefusingEngine(error)
    for _ in range(2):
        reply = h.read(0, flags=READ_FLAG_FENCE, key=KEY)
        assert reply.status == StatusCode.IO_ERROR
        assert h.journal.durable == [] and h.handler.statistics()["ledgers_cached"] == 0


def test_a_failed_fence_of_a_known_ledger_leaves_it_unfenced():
    h = Harness()
    h.add(0)
    h.handler.engine.put_ledger = lambda *a: (_ for _ in ()).throw(OSError(5, "EIO"))
    assert h.read(0, flags=READ_FLAG_FENCE, key=KEY).status == StatusCode.IO_ERROR
    assert not h.handler.ledger(L).fenced
    assert h.read(0, flags=READ_FLAG_FENCE, key=KEY).status == StatusCode.IO_ERROR


def test_any_exception_on_a_request_path_is_an_error_answer():
    h = Harness()
    h.add(0)
    h.handler.engine.get_entry = lambda *a: (_ for _ in ()).throw(RuntimeError("a bug"))
    assert h.read(0).status == StatusCode.IO_ERROR
    h.handler.engine.list_entries = lambda *a: (_ for _ in ()).throw(KeyError("a bug"))
    assert h.send(ListEntriesRequest, L, 0, 10).status == StatusCode.IO_ERROR


def test_list_entries_at_the_last_int64_id_answers_an_int64_next_id():
    h = Harness()
    last = 2**63 - 1
    h.add(last, lac=-1)
    reply = h.send(ListEntriesRequest, L, last, 1)
    assert reply.status == StatusCode.OK and reply.ranges == [[last, last]]
    assert reply.next_entry_id == -1
    (decoded,) = decode_all(encode(reply))  # what a client makes of it
    assert decoded == reply


def test_a_multi_add_with_too_many_parts_is_refused_whole():
    h = Harness(multi_add_parts_max=4)
    parts = [as_part(AddRequest(0, L, e, 0, KEY, e - 1, b"x", entry_digest(L, e, e - 1, b"x")))
             for e in range(5)]  # fmt: skip
    reply = h.send(MultiAddRequest, parts)
    assert reply.status == StatusCode.BAD_REQUEST and reply.results == []
    assert h.engine.get_entry(L, 0) is None


def test_a_multi_add_carries_at_most_request_entries_max_entries():
    h = Harness(request_entries_max=5)
    packed = pack_add_entries(
        (e, e - 1, payload_digest(b"x"), entry_digest(L, e, e - 1, b"x"), b"x") for e in range(4)
    )
    batch = as_part(AddBatchRequest(0, L, 0, KEY, packed))
    single = as_part(AddRequest(0, L, 4, 0, KEY, 3, b"x", entry_digest(L, 4, 3, b"x")))
    late = as_part(AddRequest(0, L, 5, 0, KEY, 4, b"x", entry_digest(L, 5, 4, b"x")))
    reply = h.send(MultiAddRequest, [batch, single, late])
    (reply,) = decode_all(encode(reply))
    statuses = [r.status for r in multi_add_results(reply)]
    assert statuses == [StatusCode.OK, StatusCode.OK, StatusCode.BAD_REQUEST]
    too_many = pack_add_entries(
        (e, e - 1, payload_digest(b""), entry_digest(L, e, e - 1, b""), b"") for e in range(6, 12)
    )
    assert type(h.send(AddBatchRequest, L, 0, KEY, too_many)) is ErrorResponse


async def test_long_polls_are_bounded_per_connection_and_freed_with_it():
    h = Harness(long_poll_parked_max=10, connection_long_polls_max=3)
    h.add(0)
    greedy, other = Peer(), Peer()
    poll = dict(flags=READ_FLAG_LONG_POLL, previous_lac=-1, timeout_ms=60_000)
    for _ in range(3):
        assert h.read(1, peer=greedy, **poll) is None
    assert h.read(1, peer=greedy, **poll).status == StatusCode.TOO_MANY_REQUESTS
    assert h.read(1, peer=other, **poll) is None  # another connection still has room
    assert h.handler.parked == 4
    before = len(h.replies)
    greedy.drop_long_polls()  # the connection went away: its slots come back at once
    assert h.handler.parked == 1 and len(h.replies) == before  # and nobody is answered
    h.add(1)  # LAC 0 passes: only the other connection's poll is answered
    assert h.handler.parked == 0 and h.replies[-2].status == StatusCode.OK


async def test_a_waiter_that_raises_does_not_strand_the_others(caplog):
    h = Harness()
    h.add(0)
    assert h.read(1, flags=READ_FLAG_LONG_POLL, previous_lac=-1, timeout_ms=60_000) is None
    state = h.handler.ledger(L)
    state.waiters = {"broken": lambda: 1 / 0, **state.waiters}
    h.add(1)
    assert h.replies[-2].status == StatusCode.OK and h.handler.parked == 0
    assert "failed to wake" in caplog.text


def test_the_ledger_cache_is_bounded_and_keeps_busy_ledgers():
    h = Harness(ledger_cache_max=3)
    for ledger_id in range(10):
        h.send(AddRequest, ledger_id, 0, 0, KEY, -1, b"x", entry_digest(ledger_id, 0, -1, b"x"))
    assert h.handler.statistics()["ledgers_cached"] == 3
    # Evicted ones load again from the engine, fence and all.
    h.send(ReadLacRequest, 0, READ_FLAG_FENCE, KEY)
    for ledger_id in range(1, 10):
        h.send(ReadLacRequest, ledger_id, 0, None)
    assert h.handler.ledger(0).fenced
    assert h.send(AddRequest, 0, 1, 0, KEY, 0, b"y", entry_digest(0, 1, 0, b"y")).status == (
        StatusCode.FENCED
    )
    # A fence still syncing is never evicted (a reload would think it durable).
    h.send(ReadLacRequest, 5, READ_FLAG_FENCE, KEY, sync=False)
    for ledger_id in range(6, 10):
        h.send(ReadLacRequest, ledger_id, 0, None, sync=False)
    assert 5 in h.handler._ledgers and not h.handler._ledgers[5].fence_durable
    h.journal.sync()


def test_a_ledgers_entries_record_cut_short_is_refused_by_replay():
    parts = [(L, packed([(0, bytes(30))])), (L + 1, packed([(3, bytes(24)), (4, bytes(40))]))]
    body = b"".join(ledgers_entries_record(parts)[1])
    assert [(lid, [e for e, _ in entries]) for lid, entries in unpack_ledgers_entries(body)] == [
        (L, [0]),
        (L + 1, [3, 4]),
    ]
    for cut in (5, 20, len(body) - 1):
        with pytest.raises(ValueError):
            unpack_ledgers_entries(body[:cut])
