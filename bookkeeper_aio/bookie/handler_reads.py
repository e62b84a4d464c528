"""The read path of the request handler: reads of one entry or a batch (a fencing one fences
first), long polls, the LAC a reader asks for, and the explicit LAC and LAFR writers send
(bookie/handler.py says how the handler works)."""

from __future__ import annotations

from functools import partial

from ..digest import LAC_RECORD_ENTRY_ID, LacProof, lac_digest, unpack_entry_record
from ..errors import StatusCode
from ..protocol import (
    INT64_MAX,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    WriteLacRequest,
    WriteLacResponse,
    WriteLafrRequest,
    WriteLafrResponse,
)
from .handler_state import OK, HandlerState, Reply, log
from .journal import REC_EXPLICIT_LAC
from .ledger_state import LedgerView, pack_proof
from .long_poll import LongPoll, Peer
from .read_pool import BatchRead
from .records import ledger_body


class ReadPath(HandlerState):
    """Reads, long polls, LAC reads, explicit LAC and LAFR writes."""

    def _read(self, req: ReadRequest, reply: Reply, peer: Peer) -> None:
        self.counters["reads"] += 1
        if req.flags & READ_FLAG_FENCE:

            def fenced(status: int) -> None:
                if status == OK:  # maybe later (the fence's sync): when the peer can take it
                    peer.defer(partial(self._read_entry, req, reply))
                else:
                    reply(ReadResponse(req.request_id, status, req.ledger_id, req.entry_id,
                                       None, None, None, None))  # fmt: skip

            self._fence(req.ledger_id, req.master_key, fenced)
        elif req.flags & READ_FLAG_LONG_POLL:
            self._long_poll(req, reply, peer)
        else:
            self._read_entry(req, reply, started=self._clock())

    def _read_entry(
        self,
        req: ReadRequest,
        reply: Reply,
        *,
        missing_ok: bool = False,
        started: float | None = None,
    ) -> None:
        """Answer a read of one entry, now or from a read thread (read_pool.py); ``started``:
        when a plain read arrived (its latency is observed once answered)."""
        rid, lid, eid = req.request_id, req.ledger_id, req.entry_id
        state = self.ledger(lid)
        if state is None:
            reply(ReadResponse(rid, StatusCode.NO_SUCH_LEDGER, lid, eid, None, None, None, None))
            return
        if req.master_key is not None and not self._key_ok(state, req.master_key):
            reply(ReadResponse(rid, StatusCode.UNAUTHORIZED, lid, eid, None, None, None, None))
            return

        def answer(record: bytes | None, exc: Exception | None) -> None:
            try:
                entry = unpack_entry_record(record) if record is not None else None
            except Exception as bad:
                exc = bad
            if exc is not None:
                self.counters["io_errors"] += 1
                log.error("error reading entry %d of ledger %d: %r", eid, lid, exc)
                reply(ReadResponse(rid, StatusCode.IO_ERROR, lid, eid, None, None, None, None))
            elif entry is None:
                if missing_ok:
                    status = OK
                elif state.view is LedgerView.LIMBO:
                    status = StatusCode.UNKNOWN  # BP-46: the entry may have existed
                else:
                    status = StatusCode.NO_SUCH_ENTRY
                reply(ReadResponse(rid, status, lid, eid, None, None, None, state.lac_proof))
            else:
                lac, _pdigest, digest, payload = entry
                reply(ReadResponse(rid, OK, lid, eid, lac, payload, digest, state.lac_proof))
            if started is not None:
                self.read_latency.observe(self._clock() - started)

        # (also runs from callbacks — fence durable, long-poll wake-up — so it answers
        # whatever the engine does)
        engine = self.engine
        ready = partial(engine.can_read_now, lid, eid)
        self.reads.read(lid, ready, partial(engine.get_entry, lid, eid), answer)

    def _read_batch(self, req: ReadBatchRequest, reply: Reply, peer: Peer) -> None:
        """Consecutive entries in one answer, as ReadRequests would find them one by one
        (a fencing one fences first); at most ``request_entries_max`` entries and
        ``frame_bytes_max / 2`` bytes, whatever the request asks."""
        self.counters["read_batches"] += 1
        if req.max_count < 1 or req.max_bytes < 1 or req.flags & ~READ_FLAG_FENCE:
            self.counters["read_bad_request"] += 1
            reply(ReadBatchResponse(req.request_id, StatusCode.BAD_REQUEST, req.ledger_id,
                                    req.first_entry_id, b"", OK, None))  # fmt: skip
            return
        if req.flags & READ_FLAG_FENCE:

            def fenced(status: int) -> None:
                if status == OK:  # maybe later (the fence's sync): when the peer can take it
                    peer.defer(partial(self._read_entries, req, reply))
                else:
                    reply(ReadBatchResponse(req.request_id, status, req.ledger_id,
                                            req.first_entry_id, b"", OK, None))  # fmt: skip

            self._fence(req.ledger_id, req.master_key, fenced)
        else:
            self._read_entries(req, reply)

    def _read_entries(self, req: ReadBatchRequest, reply: Reply) -> None:
        rid, lid, first = req.request_id, req.ledger_id, req.first_entry_id
        state = self.ledger(lid)
        if state is None or (
            req.master_key is not None and not self._key_ok(state, req.master_key)
        ):
            status = StatusCode.NO_SUCH_LEDGER if state is None else StatusCode.UNAUTHORIZED
            reply(ReadBatchResponse(rid, status, lid, first, b"", OK, None))
            return
        # (ids stay int64: a request may name the last one)
        count = min(req.max_count, self.config.request_entries_max, INT64_MAX - first + 1)
        budget = min(req.max_bytes, self.config.frame_bytes_max // 2)
        gathered = BatchRead(self.engine, lid, first, first + count, budget)

        def answer(_: object, exc: Exception | None) -> None:
            if exc is not None and gathered.error is None:  # (gather catches the engine's)
                gathered.error = exc
            end = OK
            if gathered.error is not None:
                self.counters["io_errors"] += 1
                log.error("error reading entry %d of ledger %d: %r", gathered.next_id, lid,
                          gathered.error)  # fmt: skip
                end = StatusCode.IO_ERROR
            elif gathered.missing:  # as _read_entry: in limbo BP-46's entry may have existed
                limbo = state.view is LedgerView.LIMBO
                end = StatusCode.UNKNOWN if limbo else StatusCode.NO_SUCH_ENTRY
            self.counters["reads"] += len(gathered.parts) // 2
            reply(ReadBatchResponse(rid, OK, lid, first, b"".join(gathered.parts), end,
                                    state.lac_proof))  # fmt: skip

        # what the engine has in memory on the loop; from the first entry that may wait on
        # the disk, the rest in a read thread
        ready = partial(gathered.gather, now_only=True)
        self.reads.read(lid, ready, partial(gathered.gather, now_only=False), answer)

    def _long_poll(self, req: ReadRequest, reply: Reply, peer: Peer) -> None:
        """Answer once the LAC passes ``previous_lac``, the ledger is fenced, or time is up
        (long_poll.py)."""
        state = self.ledger(req.ledger_id)
        if state is None or LongPoll.ready(state, req.previous_lac):
            self._read_entry(req, reply, missing_ok=state is not None)
            return
        if (
            self.parked >= self.config.long_poll_parked_max
            or len(peer.long_polls) >= self.config.connection_long_polls_max
        ):
            self.counters["long_polls_refused"] += 1
            reply(ReadResponse(req.request_id, StatusCode.TOO_MANY_REQUESTS, req.ledger_id,
                               req.entry_id, None, None, None, None))  # fmt: skip
            return
        timeout_ms = max(0, min(req.timeout_ms, self.config.long_poll_timeout_ms_max))
        answer = partial(self._read_entry, req, reply, missing_ok=True)
        LongPoll(self, state, req.previous_lac, timeout_ms / 1000, answer, peer)

    def _read_lac(self, req: ReadLacRequest, reply: Reply, peer: Peer) -> None:
        rid, lid = req.request_id, req.ledger_id

        def answer(status: int) -> None:
            try:  # also runs from the fence's journal callback: answer whatever happens
                respond(status)
            except Exception as exc:
                self._failed(req, reply, exc)

        def respond(status: int) -> None:
            state = self.ledger(lid) if status == OK else None
            if state is None:
                status = status if status != OK else StatusCode.NO_SUCH_LEDGER
                reply(ReadLacResponse(rid, status, lid, None, -1))
            elif req.master_key is not None and not self._key_ok(state, req.master_key):
                reply(ReadLacResponse(rid, StatusCode.UNAUTHORIZED, lid, None, -1))
            elif state.view is LedgerView.LIMBO:  # BP-46: its LAC may be too low: unknown
                reply(ReadLacResponse(rid, StatusCode.UNKNOWN, lid, None, -1))
            else:
                last = self.engine.last_entry_id(lid)
                reply(ReadLacResponse(rid, OK, lid, state.lac_proof, last, state.lafr))

        self.counters["read_lacs"] += 1
        if req.flags & READ_FLAG_FENCE:
            self._fence(lid, req.master_key, answer)
        else:
            answer(OK)

    # --- explicit LAC ---------------------------------------------------------------------

    def _write_lac(self, req: WriteLacRequest, reply: Reply, peer: Peer) -> None:
        rid, lid = req.request_id, req.ledger_id
        state = self.ledger(lid)
        if state is None:
            reply(WriteLacResponse(rid, StatusCode.NO_SUCH_LEDGER, lid))
            return
        if not self._key_ok(state, req.master_key):
            reply(WriteLacResponse(rid, StatusCode.UNAUTHORIZED, lid))
            return
        if req.digest != lac_digest(lid, req.lac):
            reply(WriteLacResponse(rid, StatusCode.BAD_DIGEST, lid))
            return
        proof = LacProof(LAC_RECORD_ENTRY_ID, req.lac, 0, req.digest)
        if state.explicit_lac is None or proof.lac > state.explicit_lac.lac:
            self._put_info(lid, state.info(explicit_lac=proof))
            state.explicit_lac = proof
        if state.offer_lac(proof):
            state.wake_waiters()

        def durable(exc: BaseException | None) -> None:
            reply(WriteLacResponse(rid, OK if exc is None else StatusCode.IO_ERROR, lid))

        self.counters["write_lacs"] += 1
        self.journal.append(REC_EXPLICIT_LAC, ledger_body(lid, pack_proof(proof)), durable)

    def _write_lafr(self, req: WriteLafrRequest, reply: Reply, peer: Peer) -> None:
        """Guaranteed write quorum: keep the writer's LAFR (a hint; docs/protocol.md)."""
        rid, lid = req.request_id, req.ledger_id
        state = self.ledger(lid)
        if state is None:
            reply(WriteLafrResponse(rid, StatusCode.NO_SUCH_LEDGER, lid))
        elif not self._key_ok(state, req.master_key):
            reply(WriteLafrResponse(rid, StatusCode.UNAUTHORIZED, lid))
        else:
            state.lafr = max(state.lafr, req.lafr)
            self.counters["write_lafrs"] += 1
            reply(WriteLafrResponse(rid, OK, lid))
