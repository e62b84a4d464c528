"""The writer's handle: the async driver of an :class:`.add_pipeline.AddPipeline`.

Theory of operation
-------------------
The pipeline decides (which adds are pending, acknowledged, released, what an ensemble change
re-sends, which bookies are pinned, the LAC and the LAFR); this driver moves bytes and waits.
:meth:`LedgerWriter.append_nowait` gives the payload the next entry id, computes its digest over
(ledger, entry, LAC so far, payload), pushes it into the pipeline and sends it to the entry's
write set; each bookie's answer is fed back (``acked`` / ``ack``), and the adds the pipeline
completes are told to their callers in entry order: a future resolves (or, for
:meth:`LedgerWriter.append_callback`, a callback is called) only when the add *and every
earlier one* reached the ack quorum. At most ``adds_pending_max`` adds and
``adds_pending_bytes_max`` payload bytes are pending, and at most ``bookie_backlog_bytes_max``
unanswered bytes on the connection to any bookie of the ensemble; :meth:`append` and
:meth:`wait_for_room` wait for room (backpressure, bounded memory).

Sending is batched: the adds of one loop turn go out as one frame per bookie at its end, and a
bookie with ``add_batches_in_flight_max`` unanswered batches gets its partial batch when it
answers one.

A bookie that fails an add (error, timeout, lost connection, read-only) is handed to the
pipeline, and the ensemble-change coroutine replaces the failed bookies the pipeline lets go
(not pinned): replacements come from the placement policy, the metadata gets a new segment at
the pipeline's ``segment_start`` through a compare-and-swap, and the adds the pipeline returns
are re-sent to the replacements. If the CAS finds the ledger CLOSED every pending add fails
with LedgerClosedError, if IN_RECOVERY with LedgerFencedError — as does a FENCED answer from
any bookie: another client is recovering the ledger and this writer must stop.

With **guaranteed write quorum** (a ledger created with ``guaranteed_write_quorum=True``, kept
in its metadata; docs/protocol.md) an add stays pending until it and every earlier add have WQ
copies, ensemble changes carry every add from the first one below WQ and never replace a
pinned bookie, :meth:`close` completes only when nothing is pending (else it raises
:class:`~bookkeeper_aio.errors.WriteQuorumTimeoutError` and leaves the ledger OPEN for
recovery), and the LAFR goes to the ensemble every ``explicit_lac_interval_s`` when it moved.
Ledgers without the option take none of these paths.

After ``explicit_lac_interval_s`` without adds, the writer sends its LAC to the ensemble
(WRITE_LAC) so tailing readers see the last entry. :meth:`close` drains pending adds and CASes
the metadata to CLOSED at the LAC; it succeeds if the metadata already says exactly that.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from functools import partial
from time import perf_counter
from typing import Any

from ..digest import LacProof, header_digest, payload_digest
from ..errors import (
    BookKeeperError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    StatusCode,
    TooManyRequestsError,
    UnauthorizedError,
    WriteQuorumTimeoutError,
)
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import (
    ADD_ENTRY_HEAD,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BatchFrames,
    SharedFrame,
    WriteLacRequest,
    WriteLafrRequest,
    add_entry_head,
)
from ..retry import RetryPolicy
from .add_pipeline import AddCallback, AddPipeline, PendingAdd
from .context import ClientContext
from .short_copies import ShortCopies

log = logging.getLogger(__name__)
# What an add takes in a batch beyond its payload (protocol.pack_add_entries).
FRAMING_BYTES_PER_ADD = ADD_ENTRY_HEAD.size

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


class LedgerWriter:
    """A ledger opened for writing by :meth:`BookKeeper.create_ledger`."""

    def __init__(self, ctx: ClientContext, versioned: Versioned, master_key: bytes) -> None:
        self.ctx = ctx
        self._versioned = versioned
        md: LedgerMetadata = versioned.value
        self.ledger_id = md.ledger_id
        self._key = master_key
        self._batch_frames = BatchFrames(self.ledger_id, 0, master_key)
        self._ensemble = list(md.last_ensemble()[1])
        self._e, self._wq, self._aq = md.ensemble_size, md.write_quorum, md.ack_quorum
        self._gwq = md.guaranteed_write_quorum
        self._pipe = AddPipeline(
            self._e, self._wq, self._aq, guaranteed_write_quorum=self._gwq,
            pinning=not ctx.has_bug("gwq-no-pinning"),
        )  # fmt: skip
        self._write_sets = self._pipe.write_sets
        self._loop = asyncio.get_running_loop()
        cfg = ctx.config
        self._batch_entries_max = cfg.add_batch_entries_max
        self._batch_bytes_max = cfg.add_batch_bytes_max
        self._batches_in_flight_max = cfg.add_batches_in_flight_max
        self._batches_in_flight: dict[str, int] = {}  # bookie -> our unanswered add requests
        self._overload_retry = RetryPolicy(cfg.overload_retry_backoff_s,
                                           cfg.overload_retry_backoff_max_s,
                                           cfg.overload_retries_max)  # fmt: skip
        self._room = asyncio.Event()
        self._room.set()
        self.state = WriterState.OPEN
        self._failed: BaseException | None = None
        # Guaranteed write quorum: why this writer must never close the ledger (it failed
        # with entries below WQ; a recovery will close it).
        self._unclosable: BaseException | None = None
        # Adds of this loop turn, sent as one frame per bookie at its end: new adds (each to
        # its whole write set), and for one ensemble index: retries, re-sends, and adds held
        # while add_batches_in_flight_max requests to its bookie are unanswered.
        self._fresh: list[PendingAdd] = []
        self._fresh_bytes = 0
        # Bytes every bookie's backlog can still take (_has_room); -1: unknown, ask them.
        self._backlog_credit = -1
        self._queued: dict[int, list[PendingAdd]] = {}
        self._queued_bytes: dict[int, int] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._change_task: asyncio.Task[None] | None = None
        self._ensemble_changes = 0
        # The add being timed for the client's latency histogram (stats.py), -1: none.
        self._timed_entry, self._timed_at = -1, 0.0
        self._lac_sent = -1  # highest LAC that reached the bookies (piggybacked or explicit)
        self._lafr_sent = -1  # highest LAFR sent to the ensemble (guaranteed write quorum)
        self._idle = True
        # append_callback adds completed or failed, told at the end of this loop turn (_tell);
        # each carries its outcome (no tuple per add: one object fewer for the GC).
        self._to_tell: list[PendingAdd] = []
        self._lac_task = self._loop.create_task(self._explicit_lac_loop())
        # BP-31: acknowledged entries a bookie of their write set failed to store.
        self._short = ShortCopies(ctx.metadata, self.ledger_id, "write failed after ack quorum")
        # (entry id, index) -> (add, bookie): copies a bookie refused as overloaded, until it
        # stores them (_retry_later). An add may reach AQ on the others meanwhile; its copy
        # here is still owed, and marked short if it is never made (close, replacement).
        self._overloaded: dict[tuple[int, int], tuple[PendingAdd, str]] = {}

    # --- public API -----------------------------------------------------------------------

    @property
    def metadata(self) -> LedgerMetadata:
        return self._versioned.value

    @property
    def last_add_confirmed(self) -> int:
        """The LAC: the last entry acknowledged (it and every earlier one at AQ)."""
        return self._pipe.last_add_confirmed

    @property
    def last_add_pushed(self) -> int:
        return self._pipe.last_add_pushed

    @property
    def last_add_fully_replicated(self) -> int:
        """The LAFR: with guaranteed write quorum, the last entry that (with every earlier
        one) has WQ copies; -1 otherwise."""
        return self._pipe.last_add_fully_replicated

    @property
    def length(self) -> int:
        """Payload bytes of the acknowledged entries."""
        return self._pipe.length

    @property
    def _pending(self) -> tuple[PendingAdd, ...]:
        """The adds not released, oldest first (the simulator's god's view reads it)."""
        return (*self._pipe.unreleased, *self._pipe.unacked)

    def append_nowait(self, payload: bytes) -> asyncio.Future[int]:
        """Send an entry now; a future of its entry id, resolved in entry order.

        Raises:
            LedgerClosedError: the handle is closed.
            LedgerFencedError / another BookKeeperError: the handle failed earlier.
            BookKeeperError: ``adds_pending_max`` adds or ``adds_pending_bytes_max`` bytes are
                pending; use :meth:`append`, which waits for room.
        """
        future: asyncio.Future[int] = self._loop.create_future()
        self._push(payload, future, None)
        return future

    def append_callback(self, payload: bytes, callback: AddCallback) -> int:
        """Send an entry now; return its entry id. ``callback(entry_id, error)`` is called
        once, from the event loop: with ``error`` None when the entry and every earlier one
        are acknowledged, else with the exception; callbacks are called in entry order.

        BookKeeper's ``asyncAddEntry``: no future per entry (~0.4 µs less of the client's CPU per
        entry and less for the garbage collector; docs/performance.md at e27bdd3). The callbacks of
        the adds a loop turn completed run together at its end: a callback must not block; it may
        append; an exception it raises is logged and ignored.

        Raises:
            as :meth:`append_nowait` (then ``callback`` is never called).
        """
        return self._push(payload, None, callback)

    def _push(
        self, payload: bytes, future: asyncio.Future[int] | None, callback: AddCallback | None
    ) -> int:
        self._check_open()
        if not self._has_room(len(payload)):
            raise BookKeeperError(
                f"{self._pipe.pending_count} adds ({self._pipe.pending_bytes} bytes) pending; "
                "await append() instead"
            )
        pipe = self._pipe
        entry_id = pipe.last_add_pushed + 1
        lac = pipe.last_add_confirmed
        pdigest = payload_digest(payload)
        digest = header_digest(self.ledger_id, entry_id, lac, pdigest)
        head = add_entry_head(entry_id, lac, pdigest, digest, len(payload))
        op = PendingAdd(entry_id, lac, payload, digest, head,
                        self._write_sets[entry_id % self._e], self._aq, future,
                        callback, self._gwq)  # fmt: skip
        pipe.push(op)
        if self._timed_entry < 0:
            self._timed_entry, self._timed_at = entry_id, perf_counter()
        self._backlog_credit -= len(payload) + FRAMING_BYTES_PER_ADD
        self._queue_fresh(op)
        self._idle = False
        self._lac_sent = max(self._lac_sent, lac)
        return entry_id

    async def append(self, payload: bytes) -> int:
        """Append an entry; return its id once it and every earlier entry are acknowledged.

        Raises:
            LedgerClosedError, LedgerFencedError, NotEnoughBookiesError, UnauthorizedError, ...
        """
        await self.wait_for_room(len(payload))
        return await self.append_nowait(payload)

    async def wait_for_room(self, size: int) -> None:
        """Wait until :meth:`append_nowait` can take an entry of ``size`` bytes: the
        backpressure of a writer that pipelines adds without awaiting each one.

        Raises:
            LedgerClosedError / LedgerFencedError / ...: the handle is closed or failed.
        """
        if self._has_room(size):
            self._check_open()
            return
        pool = self.ctx.pool
        pool.add_room_waiter(self._room)
        try:
            while not self._has_room(size):
                self._check_open()
                self._room.clear()
                await self._room.wait()
        finally:
            pool.discard_room_waiter(self._room)
        self._check_open()

    def _has_room(self, size: int) -> bool:
        # An entry larger than a bound still goes, alone (nothing pending / in the backlog).
        cfg = self.ctx.config
        pipe = self._pipe
        if (pipe.unacked or pipe.unreleased) and (
            pipe.pending_count >= cfg.adds_pending_max
            or pipe.pending_bytes + size > cfg.adds_pending_bytes_max
        ):
            return False
        if size <= self._backlog_credit:
            return True
        # A slow bookie beyond the ack quorum holds up no completion, yet its unanswered
        # frames pile up: wait for it too (BookKeeper's waitForWriteSet), or memory grows.
        # Adds not sent yet count with their framing, as the backlog will once they are sent.
        backlog, queued, held = self.ctx.pool.backlog_bytes, self._queued_bytes, self._queued
        fresh = self._fresh_bytes + FRAMING_BYTES_PER_ADD * len(self._fresh)
        limit = cfg.bookie_backlog_bytes_max
        headroom, used_anywhere = limit, False
        for index, bookie in enumerate(self._ensemble):
            used = backlog(bookie) + fresh
            if index in queued:
                used += queued[index] + FRAMING_BYTES_PER_ADD * len(held[index])
            if used:
                headroom, used_anywhere = min(headroom, limit - used), True
        # The appends that follow spend this credit instead of asking every bookie again
        # (8 % of a writer's CPU at 1000 adds outstanding); _flush and _send reset it, so it
        # is never older than this loop turn, as the adds of other writers not sent yet are.
        self._backlog_credit = headroom
        return size <= headroom or not used_anywhere

    async def close(self) -> None:
        """Drain pending adds, then CAS the metadata to CLOSED at the LAC.

        With guaranteed write quorum, "drained" means every entry has WQ copies; if that does
        not happen within ``close_timeout_s`` (or the writer failed first), the ledger stays
        OPEN for a recovery to close and this raises.

        Raises:
            MetadataVersionError: another client closed the ledger at a different entry.
            LedgerFencedError: a recoverer owns the ledger.
            WriteQuorumTimeoutError: guaranteed write quorum only: entries still below WQ.
        """
        if self._unclosable is not None:
            raise self._unclosable
        if self.state in (WriterState.CLOSING, WriterState.CLOSED):
            return
        if self.state is WriterState.OPEN:
            self._move(WriterState.CLOSING)
        strict = self._gwq and not self.ctx.has_bug("gwq-close-before-wq")
        pipe = self._pipe
        try:
            async with asyncio.timeout(self.ctx.config.close_timeout_s):
                while (pipe.unacked or (strict and pipe.unreleased)) and self._failed is None:
                    self._room.clear()
                    await self._room.wait()  # set by every completion and failure
        except TimeoutError:
            pass  # what is still pending fails below
        if self._unclosable is not None or (strict and not pipe.drained):
            await self._give_up_close()  # (a failure emptied the queue: _unclosable says so)
        self._lac_task.cancel()
        if self._change_task is not None:
            await asyncio.gather(self._change_task, return_exceptions=True)
        self._fail_pending(LedgerClosedError(f"ledger {self.ledger_id} closed"))
        await self._close_metadata()
        self._move(WriterState.CLOSED)
        for (entry_id, _), (op, bookie) in self._overloaded.items():
            if self._pipe.is_short_copy(op):  # acknowledged, its copy there still owed
                self._short.add(bookie, entry_id)
        self._overloaded.clear()
        if self.ctx.config.mark_short_copies:
            await self._short.report()

    async def _give_up_close(self) -> None:
        """Guaranteed write quorum: entries are still below WQ; the ledger stays OPEN."""
        pipe = self._pipe
        exc = (
            self._unclosable
            or self._failed
            or WriteQuorumTimeoutError(
                f"ledger {self.ledger_id}: entries {pipe.last_add_fully_replicated + 1}.."
                f"{pipe.last_add_pushed} did not reach the write quorum within "
                f"{self.ctx.config.close_timeout_s} s; the ledger stays open for recovery"
            )
        )
        self._fail(exc)
        self._unclosable = exc
        self._lac_task.cancel()
        if self._change_task is not None:
            await asyncio.gather(self._change_task, return_exceptions=True)
        raise exc

    async def _close_metadata(self) -> None:
        lac, length = self.last_add_confirmed, self.length

        def close_at_lac(v: Versioned) -> LedgerMetadata | None:
            md: LedgerMetadata = v.value
            if md.state is LedgerState.CLOSED:
                if md.last_entry_id == lac and md.length in (length, -1):
                    return None  # already closed exactly there
                raise MetadataVersionError(
                    f"ledger {self.ledger_id} was closed by another client at entry "
                    f"{md.last_entry_id}, not {lac}",
                    current=v,
                )
            if md.state is LedgerState.IN_RECOVERY:
                raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered")
            return md.closed(lac, length)

        self._versioned = await update_ledger(
            self.ctx.metadata, self.ledger_id, close_at_lac,
            self.ctx.config.metadata_retries_max, current=self._versioned,
        )  # fmt: skip

    def statistics(self) -> dict[str, Any]:
        return {
            **self._pipe.statistics(),
            "state": self.state.value,
            "ensemble_changes": self._ensemble_changes,
            "ensemble": list(self._ensemble),
        }

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

    # --- ensemble change ------------------------------------------------------------------

    def _bookie_failed(self, op: PendingAdd, index: int, bookie: str) -> None:
        if self._failed is not None:
            return
        pipe = self._pipe
        pipe.fail_bookie(index, bookie)
        self._start_change()
        if index in pipe.pinned() and not self._retry_later(op, index, bookie):
            # A pinned bookie cannot be replaced until the adds it holds reach WQ; if those
            # need this very bookie and it keeps failing, the writer cannot go on.
            self._fail(WriteQuorumTimeoutError(
                f"ledger {self.ledger_id}: bookie {bookie} holds acknowledged entries below "
                "the write quorum and keeps failing; the ledger stays open for recovery"
            ))  # fmt: skip

    def _start_change(self) -> None:
        task = self._change_task
        if (task is None or task.done()) and self._pipe.replaceable():
            self._change_task = self._loop.create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        pipe = self._pipe
        try:
            while self._failed is None:
                failed = pipe.begin_change()
                if not failed:
                    return  # none, or only pinned ones: _complete starts a round later
                await self._replace(failed)
                self._resend(failed, pipe.replaced(failed))
                self._complete()
                if self.ctx.config.mark_short_copies:
                    await self._short.report()
        except BookKeeperError as exc:
            pipe.abort_change()
            log.warning("ledger %d: ensemble change failed: %s", self.ledger_id, exc)
            self._fail(exc)
        except Exception as exc:  # a bug: the writer fails loudly instead of hanging its adds
            pipe.abort_change()
            log.exception("ledger %d: ensemble change failed", self.ledger_id)
            self._fail(BookKeeperError(f"ledger {self.ledger_id}: ensemble change failed: {exc!r}"))

    async def _replace(self, failed: dict[int, str]) -> None:
        self._ensemble_changes += 1
        self.ctx.stats.counters["ensemble_changes"] += 1
        if self._ensemble_changes > self.ctx.config.ensemble_changes_max:
            raise BookKeeperError(f"ledger {self.ledger_id}: too many ensemble changes")
        bookies = (await self.ctx.metadata.list_bookies()).values()
        new = list(self._ensemble)
        exclude = set(failed.values())
        for index in sorted(failed):
            new[index] = self.ctx.placement.replace_bookie(
                new, index, self._wq, bookies, self.ctx.rng, exclude
            )
        pipe = self._pipe

        def add_segment(v: Versioned) -> LedgerMetadata:
            md: LedgerMetadata = v.value
            if md.state is LedgerState.CLOSED:
                raise LedgerClosedError(f"ledger {self.ledger_id} was closed by another client")
            if md.state is LedgerState.IN_RECOVERY:
                raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered")
            # Stable while this change runs: completions and releases wait for it.
            return md.with_ensemble_change(pipe.segment_start, tuple(new))

        self._versioned = await update_ledger(
            self.ctx.metadata, self.ledger_id, add_segment,
            self.ctx.config.metadata_retries_max, current=self._versioned,
        )  # fmt: skip
        log.info("ledger %d: ensemble %s -> %s", self.ledger_id, self._ensemble, new)
        self._ensemble = new
        self._backlog_credit = -1  # the replacements' backlogs are not in it

    def _resend(self, replaced: dict[int, str], resend: dict[int, list[PendingAdd]]) -> None:
        for index in replaced:  # adds held for the old bookie: all pending ones go again
            self._queued.pop(index, None)
            self._queued_bytes.pop(index, None)
        for index, ops in resend.items():
            for op in ops:
                self._send(op, index)

    # --- explicit LAC and LAFR ------------------------------------------------------------

    async def _explicit_lac_loop(self) -> None:
        interval = self.ctx.config.explicit_lac_interval_s
        pipe = self._pipe
        while True:
            self._idle = True
            await asyncio.sleep(interval)
            if self._failed is not None:
                continue
            lac = pipe.last_add_confirmed
            if self._idle and not pipe.unacked and lac > self._lac_sent:
                proof = LacProof.explicit(self.ledger_id, lac)
                for bookie in self._ensemble:
                    self.ctx.pool.send(bookie, WriteLacRequest, self.ledger_id, self._key, lac,
                                       proof.digest, callback=_ignore)  # fmt: skip
                self._lac_sent = lac
            lafr = pipe.last_add_fully_replicated
            if lafr > self._lafr_sent:  # guaranteed write quorum only (else always -1)
                for bookie in self._ensemble:
                    self.ctx.pool.send(bookie, WriteLafrRequest, self.ledger_id, self._key,
                                       lafr, callback=_ignore)  # fmt: skip
                self._lafr_sent = lafr


def _status_name(status: Any) -> str:
    try:
        return StatusCode(status).name
    except ValueError:
        return f"status {status!r:.20}"


def _ignore(result: Any) -> None:
    """Explicit LAC and LAFR writes are best effort: a reader falls back to the piggybacked
    LAC, a recovery to the first entry of the last segment."""
