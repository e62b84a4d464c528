"""BP-31 integrity at rest, in process: ledger records (format, the choice among bookies, kept
by the handler and the engines), the LEDGER_RECORDS and SCRUB requests, the scrubber's checks
(repairs and read repair are tested with real processes: test_integrity_process.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bookkeeper_aio.bookie.handler import RequestHandler
from bookkeeper_aio.bookie.scrubber import Scrubber
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.digest import entry_digest, pack_entry_record, payload_digest
from bookkeeper_aio.engine import LedgerInfo
from bookkeeper_aio.errors import BookKeeperError, MetadataFormatError, StatusCode
from bookkeeper_aio.metadata.ledger_record import (
    Held,
    decode_record,
    encode_record,
    pack_held,
    rebuild,
    unpack_held,
)
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.metadata.model import LedgerMetadata, LedgerState
from bookkeeper_aio.protocol import (
    READ_FLAG_FENCE,
    AddRequest,
    ErrorResponse,
    LedgerRecordsRequest,
    ReadRequest,
    ScrubRequest,
)
from bookkeeper_aio.shell.recover import recover_metadata
from engines import open_engine

from .test_bookie_handler import KEY, L, ManualJournal

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def _md(**changes: object) -> LedgerMetadata:
    md = LedgerMetadata(L, 3, 3, 2, ((0, (A, B, C)),), password_hash="pw", ctime_ms=5,
                        custom_metadata={"k": b"\x00v"}, creator_token="t",
                        master_key=KEY.hex())  # fmt: skip
    return dataclasses.replace(md, **changes)


def test_a_record_round_trips_and_is_small():
    md = _md()
    assert decode_record(L, encode_record(md, 42)) == (md, 42)
    assert len(encode_record(md, 42)) < 200  # the per-ledger cost beside the entries


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x91\x01", encode_record(_md(), 1)[:-3]])
def test_a_bad_record_is_a_format_error(data):
    with pytest.raises(MetadataFormatError):
        decode_record(L, data)
    with pytest.raises(MetadataFormatError):
        unpack_held(data)


def test_rebuild_takes_the_most_advanced_record_of_any_bookie():
    first = _md()
    changed = first.with_ensemble_change(5, (A, B, D))
    closed = changed.closed(9, 100)
    holdings = {
        A: [Held(L, KEY, 9, encode_record(first, 10)), Held(8, KEY, 0, b"")],
        B: [Held(L, KEY, 9, encode_record(closed, 30))],
        D: [Held(L, KEY, 9, encode_record(changed, 20))],
        C: [Held(L, KEY, 4, b"garbage")],
    }
    rebuilt = rebuild(holdings)
    assert rebuilt.ledgers == {L: closed}
    assert rebuilt.unrecoverable == {8: [A]}  # held, but nobody kept its metadata
    assert rebuilt.bad_records == 1
    del holdings[B]
    assert rebuild(holdings).ledgers[L] == changed  # two segments beat one
    assert rebuild({A: [Held(L, KEY, 9, encode_record(first, 10))]}).ledgers[L].state is (
        LedgerState.OPEN
    )


def test_held_items_round_trip():
    held = Held(L, KEY, 9, encode_record(_md(), 3))
    assert unpack_held(pack_held(held)) == held


@pytest.mark.parametrize("engine", ["memory", "files", "rocksdb"])
def test_engines_keep_a_record_in_the_ledger_info(tmp_path, engine):
    info = LedgerInfo(KEY, True, False, b"", encode_record(_md(), 7))
    assert LedgerInfo.from_bytes(info.to_bytes()) == info
    assert LedgerInfo(KEY).to_bytes() == LedgerInfo(KEY).replace(record=b"").to_bytes()
    e = open_engine(engine, [str(tmp_path)])
    e.put_ledger(L, info)
    e.close()
    if engine != "memory":  # the memory engine forgets everything when closed
        e = open_engine(engine, [str(tmp_path)])
        assert e.get_ledger(L) == info
        e.close()


class _Bookie:
    def __init__(self) -> None:
        self.engine = open_engine("memory", ["unused"])
        self.journal = ManualJournal()
        self.handler = RequestHandler(self.engine, self.journal, BookieConfig())
        self.replies: list = []

    def send(self, msg):  # type: ignore[no-untyped-def]
        self.handler.handle(msg, self.replies.append)
        self.journal.sync()
        return self.replies[-1]

    def add(self, ledger_id: int, entry_id: int, payload: bytes) -> None:
        digest = entry_digest(ledger_id, entry_id, entry_id - 1, payload)
        msg = AddRequest(1, ledger_id, entry_id, 0, KEY, entry_id - 1, payload, digest)
        assert self.send(msg).status == StatusCode.OK


def test_ledger_records_are_kept_across_state_changes_and_paged():
    b = _Bookie()
    learned: list[int] = []
    b.handler.on_new_ledger = learned.append
    for lid in (3, 5, 9):
        b.add(lid, 0, b"x")
    assert learned == [3, 5, 9]
    record = encode_record(_md(), 2)
    assert b.handler.set_record(5, record) and not b.handler.set_record(5, record)
    assert not b.handler.set_record(404, record)  # not here: nothing stored
    fence = ReadRequest(2, 5, 0, READ_FLAG_FENCE, KEY, -1, 0)
    assert b.send(fence).status == StatusCode.OK
    assert b.engine.get_ledger(5).fenced and b.engine.get_ledger(5).record == record
    first = b.send(LedgerRecordsRequest(3, 0, 2))
    assert [unpack_held(r).ledger_id for r in first.records] == [3, 5]
    assert unpack_held(first.records[1]) == Held(5, KEY, 0, record)
    rest = b.send(LedgerRecordsRequest(4, first.next_ledger_id, 2))
    assert [unpack_held(r).ledger_id for r in rest.records] == [9] and rest.next_ledger_id == -1
    assert b.send(LedgerRecordsRequest(5, 0, 0)).status == StatusCode.BAD_REQUEST


def test_scrub_request_without_a_scrubber_is_refused():
    b = _Bookie()
    answer = b.send(ScrubRequest(1, True))
    assert type(answer) is ErrorResponse and answer.status == StatusCode.BAD_REQUEST


async def test_a_scrub_pass_finds_every_bad_copy_and_reports_what_it_cannot_repair():
    b = _Bookie()
    for entry_id in range(5):
        b.add(L, entry_id, b"payload %d" % entry_id)
    lac, good = 1, b"payload 2"
    bad_payload = pack_entry_record(lac, payload_digest(good), entry_digest(L, 2, lac, good),
                                    b"paylo@d 2")  # fmt: skip
    b.engine.put_entry(L, 2, bad_payload)  # bit rot in the payload
    b.engine.put_entry(L, 4, b"short")  # a record cut short
    scrubber = Scrubber(BookieConfig(scrub_bytes_per_s=1 << 30), b.handler, None, None)
    b.handler.scrub_control = scrubber.control
    started = b.send(ScrubRequest(1, True))
    assert (started.passes_started, started.passes_done) == (0, 0)
    await scrubber.scrub_pass()  # what run() does once asked
    done = b.send(ScrubRequest(2, False))
    assert (done.passes_started, done.passes_done, done.ledgers_done) == (1, 1, 1)
    assert (done.entries_checked, done.bad_copies, done.repaired, done.unrepaired) == (5, 2, 0, 2)


async def test_recover_metadata_with_no_bookie_to_ask_is_a_clear_error():
    try:
        with pytest.raises(BookKeeperError, match="no bookie to ask"):
            await recover_metadata("memory://recover-none", False, [])
    finally:
        MemoryMetadataStore.forget("recover-none")
