"""The handler's audit, info and operator requests: listing a ledger's entries (durably: after
the engine sync its deferred copies wait for), the bookie's info, a scrub pass, a page of
ledger records (bookie/handler.py says how the handler works)."""

from __future__ import annotations

import asyncio
import bisect
from functools import partial

from ..engine import LedgerInfo
from ..errors import StatusCode
from ..metadata.ledger_record import Held, pack_held
from ..protocol import (
    INT64_MAX,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    LedgerRecordsRequest,
    LedgerRecordsResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    ScrubRequest,
    ScrubResponse,
)
from .handler_state import OK, HandlerState, Reply
from .long_poll import Peer

# Engine syncs a listing waits for at most, should copies of its ledger keep arriving (one
# worker copies a ledger at a time, so one is the rule): then it lists anyway.
LIST_SYNCS_MAX = 3


class AuditPath(HandlerState):
    """LIST_ENTRIES, BOOKIE_INFO, SCRUB and LEDGER_RECORDS."""

    def _list_entries(self, req: ListEntriesRequest, reply: Reply, peer: Peer) -> None:
        """List what the ledger holds, durably: copies not yet synced are synced first
        (bookie/deferred.py)."""
        if not self.deferred.pending(req.ledger_id) or req.max_count <= 0:
            self._list_now(req, reply)
        elif self.sync_engine is None:  # no bookie around the handler (unit tests)
            begun = self.deferred.sync_begins()
            self.engine.sync()
            self.deferred.synced(begun)
            self._list_now(req, reply)
        else:
            task = asyncio.get_running_loop().create_task(self._list_durable(req, reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _list_durable(self, req: ListEntriesRequest, reply: Reply) -> None:
        assert self.sync_engine is not None
        timeout_s = self.config.list_sync_timeout_s
        try:
            pending = partial(self.deferred.pending, req.ledger_id)
            async with asyncio.timeout(timeout_s):
                for _ in range(LIST_SYNCS_MAX):
                    if not pending():
                        break
                    # The checkpoint skips itself if one before it covered the ledger.
                    # Shielded: a listing that gives up leaves it to finish, not cut short.
                    sync = asyncio.ensure_future(self.sync_engine(pending))
                    sync.add_done_callback(_consume)
                    await asyncio.shield(sync)
        except TimeoutError:
            message = f"engine sync for ledger {req.ledger_id}'s copies took over {timeout_s} s"
            self._failed(req, reply, TimeoutError(message))
            return
        except Exception as exc:  # the copies may not be durable: no listing
            self._failed(req, reply, exc)
            return
        self.counters["lists_after_sync"] += 1
        self._list_now(req, reply)

    def _list_now(self, req: ListEntriesRequest, reply: Reply) -> None:
        rid, lid = req.request_id, req.ledger_id
        if req.max_count <= 0 or req.start_entry_id < 0:
            reply(ListEntriesResponse(rid, StatusCode.BAD_REQUEST, lid, [], -1))
            return
        state = self.ledger(lid)
        if state is None:
            reply(ListEntriesResponse(rid, StatusCode.NO_SUCH_LEDGER, lid, [], -1))
            return
        count = min(req.max_count, self.config.list_entries_max)
        ids = self.engine.list_entries(lid, req.start_entry_id, count)
        next_id = ids[-1] + 1 if len(ids) == count and ids[-1] < INT64_MAX else -1
        reply(ListEntriesResponse(rid, OK, lid, to_ranges(ids), next_id))

    def _bookie_info(self, req: BookieInfoRequest, reply: Reply, peer: Peer) -> None:
        free, total = self.disk_space
        reply(BookieInfoResponse(req.request_id, OK, free, total, self.read_only,
                                 self.config.bookie_id))  # fmt: skip

    # --- operator requests: scrub, ledger records ------------------------------------------

    def _scrub(self, req: ScrubRequest, reply: Reply, peer: Peer) -> None:
        if self.scrub_control is None:
            reply(ErrorResponse(req.request_id, StatusCode.BAD_REQUEST, "no scrubber here"))
            return
        reply(ScrubResponse(req.request_id, OK, *self.scrub_control(req.start)))

    def _ledger_records(self, req: LedgerRecordsRequest, reply: Reply, peer: Peer) -> None:
        """A page of ledgers from ``start_ledger_id``: at most ``ledger_records_max`` of them
        and about half a frame of bytes (records carry custom metadata)."""
        if req.max_count <= 0:
            reply(LedgerRecordsResponse(req.request_id, StatusCode.BAD_REQUEST, [], -1))
            return
        ledgers = self.engine.ledgers()
        start = bisect.bisect_left(ledgers, req.start_ledger_id)
        count = min(req.max_count, self.config.ledger_records_max)
        budget = self.config.frame_bytes_max // 2
        records: list[bytes] = []
        for ledger_id in ledgers[start : start + count]:
            info = self.engine.get_ledger(ledger_id) or LedgerInfo()
            last = self.engine.last_entry_id(ledger_id)
            item = pack_held(Held(ledger_id, info.master_key, last, info.record))
            if records and len(item) > budget:
                break
            budget -= len(item)
            records.append(item)
        end = start + len(records)
        next_id = ledgers[end] if end < len(ledgers) else -1
        reply(LedgerRecordsResponse(req.request_id, OK, records, next_id))


def to_ranges(ids: list[int]) -> list[list[int]]:
    """Ascending ids as inclusive ``[first, last]`` runs: [1,2,3,7] -> [[1,3],[7,7]]."""
    ranges: list[list[int]] = []
    for i in ids:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ranges


def _consume(task: asyncio.Future[None]) -> None:
    """Retrieve a task's failure (its awaiter may have given up on it)."""
    if not task.cancelled():
        task.exception()
