"""Recovery's read-ahead (client/recovery_reads.py ``_ReadAhead``) against scripted bookies: which
entries it decides recoverable, and that a bookie's answer never counts twice, with reads of
one entry at a time and in ReadBatchRequests."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.client.recovery_reads import _ReadAhead
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.digest import entry_digest, pack_entry_record, payload_digest
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.metadata.model import LedgerMetadata
from bookkeeper_aio.protocol import (
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    pack_read_entry,
)

LEDGER = 9
BOOKIES = ("a", "b", "c")


class ScriptedPool:
    """Bookies that hold the entries ``held[bookie]`` and answer on the next loop turn; every
    entry any of them was asked for, per bookie, is counted."""

    def __init__(self, held: dict[str, set[int]]) -> None:
        self.held = held
        self.asked: Counter[tuple[str, int]] = Counter()
        self.batches = 0

    def _record(self, entry_id: int) -> bytes:
        payload = b"e%d" % entry_id
        lac = entry_id - 1
        digest = entry_digest(LEDGER, entry_id, lac, payload)
        return pack_entry_record(lac, payload_digest(payload), digest, payload)

    def send(self, bookie: str, msg_type: type, *fields: Any, callback: Any) -> None:
        if msg_type is ReadRequest:
            entry_id = fields[1]
            self.asked[bookie, entry_id] += 1
            if entry_id in self.held[bookie]:
                lac, payload = entry_id - 1, b"e%d" % entry_id
                digest = entry_digest(LEDGER, entry_id, lac, payload)
                answer = ReadResponse(0, 0, LEDGER, entry_id, lac, payload, digest, None)
            else:
                answer = ReadResponse(0, StatusCode.NO_SUCH_ENTRY, LEDGER, entry_id,
                                      None, None, None, None)  # fmt: skip
        else:
            assert msg_type is ReadBatchRequest
            self.batches += 1
            first, count = fields[1], fields[2]
            parts: list[Any] = []
            end = StatusCode.OK
            for entry_id in range(first, first + count):
                self.asked[bookie, entry_id] += 1
                if entry_id not in self.held[bookie]:
                    end = StatusCode.NO_SUCH_ENTRY
                    break
                parts += pack_read_entry(entry_id, self._record(entry_id))
            answer = ReadBatchResponse(0, 0, LEDGER, first, b"".join(parts), end, None)
        asyncio.get_running_loop().call_soon(callback, answer)


async def recover_reads(held: dict[str, set[int]], batch: int, ahead: int) -> tuple[int, Any]:
    """Run the read-ahead from entry 0 to its end; the last recoverable entry, the pool."""
    pool = ScriptedPool(held)
    config = ClientConfig(recovery_read_batch_entries=batch)
    ctx = SimpleNamespace(config=config, pool=pool, has_bug=lambda name: False)
    md = LedgerMetadata(LEDGER, 3, 3, 2, ((0, BOOKIES),))
    reads = _ReadAhead(ctx, md, b"k" * 20, 0, ahead)  # type: ignore[arg-type]
    last = -1
    try:
        async with asyncio.timeout(10):
            while True:
                got, at_end = await reads.take(ahead // 2)
                if got:
                    last = got[-1].entry_id
                if at_end:
                    return last, pool
    finally:
        reads.close()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(20, 120),  # entries on AQ (2) or more bookies
    st.integers(0, 2),  # the bookie missing some of them
    st.integers(0, 119),
    st.integers(0, 30),
    st.sampled_from([0, 2, 3, 4, 8]),
)
def test_every_entry_on_ack_quorum_bookies_is_recovered_and_no_answer_counts_twice(
    length: int, lacking: int, gap_from: int, gap_len: int, batch: int
) -> None:
    # One bookie lacks a run of entries (a slow replica beyond AQ): each of them is still on
    # two bookies, hence written, so recovery must go on past it to the true end.
    held = {b: set(range(length)) for b in BOOKIES}
    held[BOOKIES[lacking]] -= set(range(gap_from, gap_from + gap_len))
    last, pool = asyncio.run(recover_reads(held, batch, ahead=16))
    assert last == length - 1
    assert max(pool.asked.values()) == 1, [k for k, n in pool.asked.items() if n > 1]
    if batch and length > 2 * batch + 16:
        assert pool.batches > 0
