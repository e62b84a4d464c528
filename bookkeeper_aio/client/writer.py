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

With **guaranteed write quorum** (a ledger created with ``guaranteed_write_quorum=True``, kept
in its metadata; docs/protocol.md) an add stays pending until it and every earlier add have WQ
copies, ensemble changes carry every add from the first one below WQ and never replace a
pinned bookie, :meth:`close` completes only when nothing is pending (else it raises
:class:`~bookkeeper_aio.errors.WriteQuorumTimeoutError` and leaves the ledger OPEN for
recovery), and the LAFR goes to the ensemble every ``explicit_lac_interval_s`` when it moved.
Ledgers without the option take none of these paths.

:meth:`close` drains pending adds and CASes the metadata to CLOSED at the LAC; it succeeds
if the metadata already says exactly that.

:class:`LedgerWriter` is the handle (its state, public API, backpressure and close); its parts
are mixins, one concept a module: the add path — batching, sending, acknowledgements, overload
retries, failing (:class:`~.writer_adds.WriterAdds`, ``writer_adds.py``) — and the ensemble —
the ensemble change when a bookie fails, the explicit LAC and LAFR
(:class:`~.writer_ensemble.WriterEnsemble`, ``writer_ensemble.py``).
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

from ..digest import header_digest, payload_digest
from ..errors import (
    BookKeeperError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    WriteQuorumTimeoutError,
)
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import ADD_ENTRY_HEAD, BatchFrames, add_entry_head
from ..retry import RetryPolicy
from .add_pipeline import AddCallback, AddPipeline, PendingAdd
from .context import ClientContext
from .short_copies import ShortCopies
from .writer_adds import WriterAdds, WriterState
from .writer_ensemble import WriterEnsemble

# What an add takes in a batch beyond its payload (protocol.pack_add_entries).
FRAMING_BYTES_PER_ADD = ADD_ENTRY_HEAD.size


class LedgerWriter(WriterAdds, WriterEnsemble):
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
