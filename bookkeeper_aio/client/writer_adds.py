"""A ledger writer's add path: adds sent to their bookies, and the bookies' answers acted on.

Theory of operation
-------------------
Sending is batched: the adds of one loop turn go out as one frame per bookie at its end, and a
bookie with ``add_batches_in_flight_max`` unanswered batches gets its partial batch when it
answers one.

Each answer goes to the pipeline (``acked`` for a whole batch, ``ack`` for one add), and the
adds it completes are told to their callers in entry order (``_finish`` says when). A bookie
that refuses an add as overloaded gets it again after a backoff (``overload_retry_backoff_s``,
at most ``overload_retries_max`` times) before it counts as failed; a failed bookie goes to the
ensemble change (``writer_ensemble.py``); a FENCED or UNAUTHORIZED answer fails the writer, and
with it every pending add. The writer's lifecycle (:class:`WriterState`) is here, with the
failing that moves it.

:class:`WriterAdds` is a part of :class:`~bookkeeper_aio.client.writer.LedgerWriter` (a mixin:
one concept per module); the handle, its public API, backpressure and close are in
``writer.py``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..errors import (
    LedgerClosedError,
    LedgerFencedError,
    StatusCode,
    TooManyRequestsError,
    UnauthorizedError,
)
from ..protocol import AddBatchResponse, AddRequest, AddResponse, BatchFrames, SharedFrame
from ..retry import RetryPolicy
from .add_pipeline import AddPipeline, PendingAdd
from .context import ClientContext
from .short_copies import ShortCopies

log = logging.getLogger(__name__)

_Packed = tuple[list[PendingAdd], SharedFrame] | None


class WriterState(enum.Enum):
    """A writer's lifecycle: OPEN -> CLOSING -> CLOSED, and OPEN / CLOSING -> FAILED."""

    OPEN = "open"  # takes adds
    CLOSING = "closing"  # close() waits for pending adds (with GWQ: for their WQ copies)
    CLOSED = "closed"  # close() is done (or gave up after a failure)
    FAILED = "failed"  # fenced, unauthorized, an ensemble change failed, or WQ not reached


_MOVES = frozenset(
    {
        (WriterState.OPEN, WriterState.CLOSING),
        (WriterState.CLOSING, WriterState.CLOSED),
        (WriterState.OPEN, WriterState.FAILED),
        (WriterState.CLOSING, WriterState.FAILED),
        (WriterState.FAILED, WriterState.CLOSED),
    }
)


class WriterAdds:
    """The add path of a ledger writer (see the module docstring). The state is
    :class:`~.writer.LedgerWriter`'s (its ``__init__``)."""

    ctx: ClientContext
    ledger_id: int
    state: WriterState
    _key: bytes
    _batch_frames: BatchFrames
    _ensemble: list[str]
    _e: int
    _wq: int
    _gwq: bool
    _pipe: AddPipeline
    _write_sets: list[tuple[int, ...]]
    _loop: asyncio.AbstractEventLoop
    _batch_entries_max: int
    _batch_bytes_max: int
    _batches_in_flight_max: int
    _batches_in_flight: dict[str, int]
    _overload_retry: RetryPolicy
    _room: asyncio.Event
    _failed: BaseException | None
    _unclosable: BaseException | None
    _fresh: list[PendingAdd]
    _fresh_bytes: int
    _backlog_credit: int
    _queued: dict[int, list[PendingAdd]]
    _queued_bytes: dict[int, int]
    _flush_handle: asyncio.Handle | None
    _timed_entry: int
    _timed_at: float
    _to_tell: list[PendingAdd]
    _lac_task: asyncio.Task[None]
    _short: ShortCopies
    _overloaded: dict[tuple[int, int], tuple[PendingAdd, str]]

    if TYPE_CHECKING:  # the handle's and the ensemble's (writer.py, writer_ensemble.py)

        @property
        def last_add_confirmed(self) -> int: ...

        def _bookie_failed(self, op: PendingAdd, index: int, bookie: str) -> None: ...

        def _start_change(self) -> None: ...

    # --- sending and acknowledgements -----------------------------------------------------

    def _move(self, state: WriterState) -> None:
        assert (self.state, state) in _MOVES, (self.state, state)
        self.state = state

    def _check_open(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self.state is not WriterState.OPEN:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")

    def _queue_fresh(self, op: PendingAdd) -> None:
        """Queue a new add for its whole write set: sent at the end of this loop turn with
        the others (or now, when a batch is full). One list for every bookie, not one per
        bookie: with E == WQ the flush sends that very list, packed once, to each."""
        fresh = self._fresh
        fresh.append(op)
        self._fresh_bytes += len(op.payload)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        elif len(fresh) >= self._batch_entries_max or self._fresh_bytes >= self._batch_bytes_max:
            self._flush()  # the bounds hold for each bookie's share, whatever the striping

    def _send(self, op: PendingAdd, index: int) -> None:
        """Queue an add for the bookie at ``index`` only (a retry, a re-send after an
        ensemble change); sent at the end of this loop turn, like new adds."""
        if index in self._pipe.changing:
            return  # re-sent to the replacement once the ensemble change is committed
        if op in self._fresh:
            return  # a new add not flushed yet: the flush sends it to its whole write set
        self._backlog_credit = -1
        queued = self._queued.get(index)
        if queued is None:
            self._queued[index] = [op]
            self._queued_bytes[index] = len(op.payload)
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush)
            return
        queued.append(op)
        size = self._queued_bytes[index] = self._queued_bytes[index] + len(op.payload)
        if len(queued) >= self._batch_entries_max or size >= self._batch_bytes_max:
            self._flush()  # every index, so that identical batches are still packed once

    def _flush(self) -> None:
        self._backlog_credit = -1
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        fresh, fresh_bytes, self._fresh, self._fresh_bytes = self._fresh, self._fresh_bytes, [], 0
        extra, extra_bytes = self._queued, self._queued_bytes
        self._queued, self._queued_bytes = {}, {}
        everyone = self._e == self._wq
        frame = None
        # The first add's write set in its order (as BookKeeper sends an entry), then the rest.
        order = self._write_sets[fresh[0].entry_id % self._e] if fresh else ()
        for index in (*order, *(i for i in range(self._e) if i not in order)):
            ops = fresh if everyone else [op for op in fresh if index in op.write_set]
            added = fresh_bytes if everyone else sum(len(op.payload) for op in ops)
            more = extra.get(index)
            if more:
                more.extend(ops)  # older first
                ops = more
            if not ops:
                continue
            bookie = self._ensemble[index]
            size = extra_bytes.get(index, 0) + added
            if (
                self._batches_in_flight.get(bookie, 0) >= self._batches_in_flight_max
                and len(ops) < self._batch_entries_max
                and size < self._batch_bytes_max
            ):
                # A partial batch waits until the bookie answers one (_on_batch flushes
                # again): under load a batch then carries what arrived during a round trip,
                # not one loop turn. Full batches never wait: waiting would cap a writer at
                # add_batches_in_flight_max batches per round trip (a slow fdatasync).
                # A copy of the shared list: other bookies' requests hold it, unchanged.
                self._queued[index] = ops if more else list(ops)
                self._queued_bytes[index] = size
                continue
            # With E == WQ every bookie gets the same adds: the frame is packed once.
            for chunk in self._chunks(ops) if more else (ops,):
                frame = self._send_batch(index, chunk, frame)

    def _chunks(self, ops: list[PendingAdd]) -> list[list[PendingAdd]]:
        """``ops`` cut into batches within add_batch_entries_max and add_batch_bytes_max."""
        chunks: list[list[PendingAdd]] = [[]]
        size = 0
        for op in ops:
            if chunks[-1] and (
                len(chunks[-1]) >= self._batch_entries_max
                or size + len(op.payload) > self._batch_bytes_max
            ):
                chunks.append([])
                size = 0
            chunks[-1].append(op)
            size += len(op.payload)
        return chunks

    def _send_batch(self, index: int, ops: list[PendingAdd], previous: _Packed) -> _Packed:
        """Send ``ops`` to the bookie at ``index`` (reusing ``previous`` if it packed the same
        adds); return what was packed."""
        if index in self._pipe.changing or self._failed is not None:
            # Changing: re-sent to the replacement once the change is committed. Failed:
            # every pending add has failed already.
            return previous
        if previous is not None and (previous[0] is ops or previous[0] == ops):
            frame = previous[1]
        elif len(ops) == 1:
            op = ops[0]
            frame = SharedFrame(AddRequest, self.ledger_id, op.entry_id, 0, self._key, op.lac,
                                op.payload, op.digest)  # fmt: skip
        else:  # protocol.pack_add_entries, from the heads packed once per add
            parts: list[bytes] = []
            for op in ops:
                parts += (op.head, op.payload)
            frame = self._batch_frames.frame(b"".join(parts))
        bookie = self._ensemble[index]
        self._batches_in_flight[bookie] = self._batches_in_flight.get(bookie, 0) + 1
        self.ctx.pool.send_shared(bookie, frame, partial(self._on_batch, ops, index, bookie))
        return ops, frame

    def _on_batch(self, ops: list[PendingAdd], index: int, bookie: str, result: Any) -> None:
        # Called once per request, whatever its fate: the bookie has room for another batch.
        left = self._batches_in_flight.pop(bookie, 1) - 1
        if left:
            self._batches_in_flight[bookie] = left
        if self._queued and self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if (
            type(result) is AddBatchResponse
            and result.status == StatusCode.OK
            and len(result.statuses) == len(ops)
            and self._ensemble[index] == bookie
        ):  # the common case: what _on_add does for each OK, completing once
            if self._overloaded:
                for op in ops:
                    self._overloaded.pop((op.entry_id, index), None)
            if self._pipe.acked(ops, index):
                self._complete()
        elif type(result) is AddBatchResponse and len(result.statuses) == len(ops):
            for op, status in zip(ops, result.statuses, strict=True):
                self._on_add(op, index, bookie, status)
        elif type(result) is AddResponse:
            self._on_add(ops[0], index, bookie, result.status)
        else:  # an exception, or a batch refused as a whole
            for op in ops:
                self._on_add(op, index, bookie, result)

    def _on_add(self, op: PendingAdd, index: int, bookie: str, result: Any) -> None:
        """``result``: the add's status, or an exception / a response for a failed request."""
        ok = type(result) is int and result == StatusCode.OK
        if not ok and self._pipe.is_short_copy(op):
            self._short.add(bookie, op.entry_id)  # acknowledged at AQ, not here (BP-31)
        if self._ensemble[index] != bookie:
            return  # an answer from a bookie that was replaced
        if ok:
            if self._overloaded:
                self._overloaded.pop((op.entry_id, index), None)
            if self._pipe.ack(op, index):
                self._complete()
            return
        if op.done and (
            self._failed is not None
            or (self.state is not WriterState.OPEN and not self._gwq)
            or self.state is WriterState.CLOSED
        ):
            return  # (with GWQ a closing writer still needs its acknowledged adds at WQ)
        # A failure after the entry reached its ack quorum still replaces the bookie (as
        # BookKeeper does): a bookie that is slow or gone beyond the ack quorum must not
        # hold up the writer's backpressure (bookie_backlog_bytes_max) for ever.
        status = result if type(result) is int else getattr(result, "status", None)
        if status == StatusCode.TOO_MANY_REQUESTS or isinstance(result, TooManyRequestsError):
            # Overload, not failure: retry the same bookie after a backoff; only a bookie that
            # stays overloaded for the whole retry policy is replaced.
            if self._retry_later(op, index, bookie):
                return
            log.info("ledger %d: bookie %s still overloaded after %d retries", self.ledger_id,
                     bookie, op.overloads - 1)  # fmt: skip
            op.overloads = 0
            self._overloaded.pop((op.entry_id, index), None)  # short (above) if acknowledged
            self._bookie_failed(op, index, bookie)
        elif status == StatusCode.FENCED:
            self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recoverer"))
        elif status == StatusCode.UNAUTHORIZED:
            self._fail(UnauthorizedError(f"bookie {bookie} refused our key for {self.ledger_id}"))
        else:
            why = result if isinstance(result, BaseException) else _status_name(status)
            log.info("ledger %d: bookie %s failed an add (%s)", self.ledger_id, bookie, why)
            self._bookie_failed(op, index, bookie)

    def _retry_later(self, op: PendingAdd, index: int, bookie: str) -> bool:
        """Send ``op`` to ``bookie`` again after a backoff; False once the policy is spent."""
        attempt = getattr(op, "overloads", 0) + 1
        op.overloads = attempt
        delay = self._overload_retry.delay_s(attempt, self.ctx.rng)
        if delay is None:
            return False
        self._overloaded[(op.entry_id, index)] = (op, bookie)
        self._loop.call_later(delay, self._retry, op, index, bookie)
        return True

    def _retry(self, op: PendingAdd, index: int, bookie: str) -> None:
        if (
            self._ensemble[index] != bookie
            or self._failed is not None
            or self.state is WriterState.CLOSED
        ):
            # Replaced (the entry stays in its segment, one copy short), failed, or closed
            # (close marked what was still owed).
            if self._overloaded.pop((op.entry_id, index), None) and self._pipe.is_short_copy(op):
                self._short.add(bookie, op.entry_id)
            return
        if (
            not op.done
            or (self._gwq and op.entry_id > self._pipe.last_add_fully_replicated)
            or self._pipe.is_short_copy(op)
        ):
            # An add acknowledged meanwhile (AQ reached on the others) still owes this copy:
            # nothing else writes it (BP-31: WQ copies), and a failure now marks it short.
            self._send(op, index)

    def _complete(self) -> None:
        """Tell the callers of the adds the pipeline acknowledged; wake waiters for room."""
        pipe = self._pipe
        first = self.last_add_confirmed
        for op in pipe.complete():
            self._finish(op, None)
        if self.last_add_confirmed != first:
            self._count_completed(self.last_add_confirmed - first)
        self._room.set()  # waiters re-check their own size
        if pipe.failed_bookies and self._failed is None:
            self._start_change()  # releases may have unpinned a failed bookie

    def _count_completed(self, count: int) -> None:
        stats = self.ctx.stats
        stats.counters["adds_completed"] += count
        if 0 <= self._timed_entry <= self.last_add_confirmed:
            stats.add_latency.observe(perf_counter() - self._timed_at)
            self._timed_entry = -1

    def _finish(self, op: PendingAdd, error: BaseException | None) -> None:
        """Tell ``op``'s caller it completed or failed: a future at once (it runs its
        callbacks in a later loop turn itself), a callback at the end of this loop turn, in
        order. Not at once: the answers that arrived together are all processed first (a
        callback that appends may send 3 x 256 KiB before the next answer's acks are seen;
        told at once, `writes --outstanding 1000` measured 5-15 % fewer entries/s). Except
        the last pending add completing with none waiting to be told: no later answer can
        complete another, and one add at a time saves a loop turn."""
        if op.future is not None:
            op.finish(error)
            return
        if error is None and not self._pipe.unacked and not self._to_tell:
            op.finish(None)
            return
        op.done = True
        op.error = error
        if not self._to_tell:
            self._loop.call_soon(self._tell)
        self._to_tell.append(op)

    def _tell(self) -> None:
        told, self._to_tell = self._to_tell, []
        for op in told:
            op.finish(op.error)

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            if self._gwq and not self._pipe.drained:
                # Entries may be below WQ: closing the ledger is a recovery's job now.
                self._unclosable = exc
            if self.state in (WriterState.OPEN, WriterState.CLOSING):
                self._move(WriterState.FAILED)
            self._lac_task.cancel()  # a failed writer has no LAC to send any more
        self._fail_pending(exc)

    def _fail_pending(self, exc: BaseException) -> None:
        for op in self._pipe.take_all():
            self._finish(op, exc)
        self._room.set()


def _status_name(status: Any) -> str:
    try:
        return StatusCode(status).name
    except ValueError:
        return f"status {status!r:.20}"
