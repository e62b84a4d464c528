"""The add path of the request handler: an add, an add batch and a multi-add, checked, stored in
the engine and answered once journaled (bookie/handler.py says how the handler works)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..digest import MASTER_KEY_BYTES, LacProof, header_digest, payload_digest
from ..errors import StatusCode
from ..protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    PACKED_ENTRY_PREFIX,
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BadFrame,
    CheckedEntry,
    ErrorResponse,
    Message,
    MultiAddRequest,
    MultiAddResponse,
    add_entry_head,
    as_part,
    check_add_entries,
    multi_add_parts,
)
from .handler_state import OK, HandlerState, Reply, _ignore, error_response
from .journal import REC_MASTER_KEY
from .ledger_state import LedgerView
from .long_poll import Peer
from .records import Journaled, entries_record, ledger_body, ledgers_entries_record, packed
from .trace import TracedReply


class AddPath(HandlerState):
    """Adds: ``_add``, ``_add_batch``, ``_multi_add``."""

    def _add(self, req: AddRequest, reply: Reply, peer: Peer) -> None:
        started = self._clock()
        if self.trace is not None:
            reply = TracedReply(self.trace, reply, req.ledger_id, req.entry_id, 1)
        answer, journaled = self._stage_add(req)
        self._answer_when_durable(answer, journaled, reply, started)

    def _add_batch(self, req: AddBatchRequest, reply: Reply, peer: Peer) -> None:
        """Each entry as :meth:`_add` would; one journal record for the stored ones and one
        answer once it is durable."""
        started = self._clock()
        handled = time.perf_counter() if self.trace is not None else 0.0
        entries, answer, journaled = self._stage_batch(req)
        if self.trace is not None and entries:
            reply = TracedReply(self.trace, reply, req.ledger_id, entries[0][0], len(entries),
                                handled)  # fmt: skip
        self._answer_when_durable(answer, journaled, reply, started)

    def _answer_when_durable(
        self, answer: Message, journaled: Journaled | None, reply: Reply, started: float
    ) -> None:
        """Reply ``answer`` now if there are no ``journaled`` entries to wait for, else once
        their record is durable (its stored entries IO_ERROR if the journal fails)."""
        if journaled is None:
            reply(answer)
            return

        def durable(exc: BaseException | None) -> None:
            reply(answer if exc is None else _failed_answer(answer))
            self.add_latency.observe(self._clock() - started)

        if type(reply) is TracedReply:  # before: the journal thread may take it at once
            reply.queued_now()
        self.journal.append(*entries_record(journaled), durable)

    def _stage_add(self, req: AddRequest) -> tuple[AddResponse, Journaled | None]:
        """Check and store an add: its answer once its entry is journaled (None: nothing to
        journal, the answer is final now), and the entry to journal."""
        rid, lid, eid = req.request_id, req.ledger_id, req.entry_id
        pdigest = payload_digest(req.payload)
        # The entry packed as a batch carries it, once: the engine stores it so and the
        # journal record holds it so. (The rocksdb engine packed it again: ~2 % of a bookie's
        # samples in an open loop over 100 ledgers, whose multi-adds are mostly lone adds.)
        one = add_entry_head(eid, req.lac, pdigest, req.digest, len(req.payload)) + req.payload
        record = memoryview(one)[PACKED_ENTRY_PREFIX.size :]
        intact = header_digest(lid, eid, req.lac, pdigest) == req.digest
        entry = (eid, req.lac, pdigest, req.digest, record, intact)
        statuses, journaled = self._store(lid, req.flags, req.master_key, (entry,), one)
        answer = AddResponse(rid, statuses[0], lid, eid)
        return answer, (lid, (one,)) if journaled else None

    def _stage_batch(
        self, req: AddBatchRequest, entries_max: int = 0
    ) -> tuple[list[CheckedEntry], Message, Journaled | None]:
        """Check and store an add batch: the entries it carried (none if refused whole), its
        answer once its stored entries are journaled (None: nothing to journal, the answer
        is final now), and those entries."""
        rid, lid = req.request_id, req.ledger_id
        try:
            entries_max = entries_max or self.config.request_entries_max
            entries = check_add_entries(lid, req.entries, entries_max=entries_max)
        except ValueError as exc:
            self.counters["add_bad_request"] += 1
            return [], ErrorResponse(rid, StatusCode.BAD_REQUEST, f"AddBatchRequest: {exc}"), None
        statuses, journaled = self._store(lid, req.flags, req.master_key, entries, req.entries)
        answer = AddBatchResponse(rid, _first_failure(statuses), lid, statuses)
        if not journaled:
            return entries, answer, None
        if len(journaled) == len(entries):  # the request's bytes are the record's body
            return entries, answer, (lid, (req.entries,))
        return entries, answer, (lid, packed(journaled))

    def _multi_add(self, req: MultiAddRequest, reply: Reply, peer: Peer) -> None:
        """Each part checked and stored as if it had come alone; one answer once every part
        has its own. At most ``multi_add_parts_max`` parts (else refused whole) and
        ``request_entries_max`` entries in all (the parts past it are refused).

        The parts' stored entries are journaled as one record (``REC_LEDGERS_ENTRIES``) with
        one callback. (A record, a callback, an answer object and a closure per part cost the
        bookie more than the part's entries when 100 ledgers share a request.)"""
        if len(req.parts) > self.config.multi_add_parts_max:
            self.counters["add_bad_request"] += 1
            reply(MultiAddResponse(req.request_id, StatusCode.BAD_REQUEST, []))
            return
        started = self._clock()
        parts = multi_add_parts(req)
        results: list[list[Any]] = [[] for _ in parts]
        journaled: list[Journaled] = []  # the stored entries of each part, in order
        waiting: list[tuple[int, Message]] = []  # (part, its answer once journaled)
        traced: list[tuple[int, int, int, float]] = []  # (lid, first, count, handled) of each
        entries_left = self.config.request_entries_max
        for index, part in enumerate(parts):
            reason = part.reason if type(part) is BadFrame else None
            if reason is None and entries_left <= 0:
                reason = f"more than request_entries_max {self.config.request_entries_max} entries"
            if reason is not None:
                self.counters["add_bad_request"] += 1
                results[index] = as_part(
                    ErrorResponse(req.request_id, StatusCode.BAD_REQUEST, reason)
                )
                continue
            assert type(part) is not BadFrame  # a BadFrame has its reason
            handled = time.perf_counter() if self.trace is not None else 0.0
            try:
                if type(part) is AddBatchRequest:
                    entries, answer, stored = self._stage_batch(part, entries_left)
                    entries_left -= len(entries) or 1
                    span = (entries[0][0], len(entries)) if entries else (0, 0)
                else:
                    assert type(part) is AddRequest  # multi_add_parts: an add or a batch
                    entries_left -= 1
                    answer, stored = self._stage_add(part)
                    span = (part.entry_id, 1)
            except Exception as exc:
                self._note_failure(part, exc)
                results[index] = as_part(error_response(part, StatusCode.IO_ERROR))
                continue
            if stored is None:
                results[index] = as_part(answer)
                continue
            journaled.append(stored)
            waiting.append((index, answer))
            if self.trace is not None:
                traced.append((part.ledger_id, *span, handled))
        if not journaled:
            reply(MultiAddResponse(req.request_id, OK, results))
            return
        queued = time.perf_counter() if self.trace is not None else 0.0

        def durable(exc: BaseException | None) -> None:
            for index, answer in waiting:
                results[index] = as_part(answer if exc is None else _failed_answer(answer))
            if self.trace is not None:
                for lid, first, count, handled in traced:
                    self.trace.request(lid, first, count, handled, queued)
            reply(MultiAddResponse(req.request_id, OK, results))
            self.add_latency.observe_many(self._clock() - started, len(waiting))

        try:
            self.journal.append(*ledgers_entries_record(journaled), durable)
        except Exception as exc:  # the journal failed: no part is known durable
            self._note_failure(req, exc)
            durable(exc)

    def _store(
        self,
        lid: int,
        flags: int,
        key: bytes,
        entries: Sequence[tuple[int, int, int, int, bytes | memoryview, bool]],
        packed: bytes | None = None,
    ) -> tuple[list[StatusCode], list[tuple[int, bytes | memoryview]]]:
        """Check ``(entry_id, lac, payload_digest, digest, record, intact)`` entries of one
        ledger (``intact``: the digests matched, protocol.check_add_entries) and put those
        that pass into the engine (``packed``: the entries packed as an add batch carries
        them, which the engine gets too when every entry passed). Returns each
        entry's status and the (entry id, record) pairs that still have to be journaled
        before the answer (none without data journaling, nor for deferred-sync copies).

        Per-entry checks come first (ids, the writer's LAC below its entry, read-only, the
        digests), then the ledger's (its key, the fence): a batch whose every digest is wrong
        creates no ledger. A batch is checked as a whole before anything is stored, which is
        what checking its entries one by one would give: nothing between them can change
        the ledger's state.
        """
        recovery = flags & ADD_FLAG_RECOVERY
        deferred = flags & ADD_FLAG_DEFERRED_SYNC
        if len(key) != MASTER_KEY_BYTES or (deferred and not recovery):
            # ids: the codec refuses a ledger id < 0; a writer's add is durable when answered
            return self._refused([StatusCode.BAD_REQUEST] * len(entries)), []
        refuse_all = StatusCode.READ_ONLY if self.read_only and not recovery else None
        statuses: list[StatusCode] = []
        stored: list[tuple[int, bytes | memoryview]] = []  # (entry id, record) of those passed
        best: tuple[int, int, int, int] | None = None  # the passing entry with the highest LAC
        for eid, lac, pdigest, digest, record, intact in entries:
            if eid < 0 or (lac >= eid and not recovery):  # a writer's LAC is below its entry
                statuses.append(StatusCode.BAD_REQUEST)
            elif refuse_all is not None:
                statuses.append(refuse_all)
            elif not intact:
                statuses.append(StatusCode.BAD_DIGEST)
            else:
                statuses.append(OK)
                stored.append((eid, record))
                if best is None or lac > best[1]:
                    best = (eid, lac, pdigest, digest)
        if best is None:
            return self._refused(statuses), []
        state = self.ledger(lid)
        refusal = None
        gone = state is None and lid in self._deleted and not (recovery and self._deleted[lid])
        if gone or (self._held_adds and lid in self._held_adds):
            # A writer that outlived its ledger: the ledger was closed (its fence, deleted
            # with the data, had refused this add) and then deleted. Creating it again would
            # acknowledge an entry of a closed ledger (NoDivergenceBetweenClientAndMetaData).
            # Or the GC is about to delete this bookie's extra copy of it (hold_adds). A
            # copy of a ledger whose extra copy was deleted here is welcome: it lives on.
            refusal = StatusCode.NO_SUCH_LEDGER if recovery else StatusCode.FENCED
            return self._refused([refusal if s is OK else s for s in statuses]), []
        if state is None:
            state = self._new_ledger(lid, key, LedgerView.ACTIVE)
            self.journal.append(REC_MASTER_KEY, ledger_body(lid, key), _ignore)
        elif key != state.master_key and not self._key_ok(state, key):
            refusal = StatusCode.UNAUTHORIZED
        elif state.view is not LedgerView.ACTIVE and state.fenced and not recovery:
            refusal = StatusCode.FENCED
        if refusal is not None:
            return self._refused([refusal if s is OK else s for s in statuses]), []
        if len(stored) < len(statuses):
            self._refused(statuses)
            packed = None
        self.engine.put_entries(lid, stored, packed, bool(recovery), bool(deferred))
        self.counters["adds"] += len(stored)
        if self.on_engine_pressure is not None:
            self._unchecked_bytes += (
                len(packed) if packed is not None else sum(len(r) for _, r in stored)
            )
            if self._unchecked_bytes >= self.config.engine_pressure_check_bytes:
                self._unchecked_bytes = 0
                if self.engine.write_pressure():
                    self.on_engine_pressure()
        if state.offer_lac(LacProof(*best)) and state.waiters:
            state.wake_waiters()
        if deferred:  # durable at the next engine sync, which a listing waits for
            self.deferred.stored(lid)
            self.counters["copies_deferred"] += len(stored)
            return statuses, []
        # BP-46 without the journal: the replicas and the limbo protocol make up for a crash
        # that loses what the engine had not synced.
        return statuses, stored if self.config.journal_write_data else []

    def _refused(self, statuses: list[StatusCode]) -> list[StatusCode]:
        for status in statuses:
            if status is not OK:
                self.counters[f"add_{status.name.lower()}"] += 1
        return statuses


def _first_failure(statuses: list[StatusCode]) -> StatusCode:
    if statuses.count(OK) == len(statuses):  # the common case, without a generator
        return OK
    return next(s for s in statuses if s is not OK)


def _failed_answer(answer: Message) -> Message:
    """An add's answer when its journal record failed: its stored entries (those OK) are
    IO_ERROR, the refused ones keep their status."""
    if type(answer) is AddBatchResponse:
        statuses = [StatusCode.IO_ERROR if s is OK else StatusCode(s) for s in answer.statuses]
        return answer._replace(status=_first_failure(statuses), statuses=statuses)
    assert type(answer) is AddResponse
    return answer._replace(status=StatusCode.IO_ERROR)
