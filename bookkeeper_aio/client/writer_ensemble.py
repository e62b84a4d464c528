"""A ledger writer's ensemble: failed bookies replaced, and the explicit LAC and LAFR sent.

Theory of operation
-------------------
A bookie that fails an add (error, timeout, lost connection, read-only) is handed to the
pipeline, and the ensemble-change coroutine replaces the failed bookies the pipeline lets go
(not pinned): replacements come from the placement policy, the metadata gets a new segment at
the pipeline's ``segment_start`` through a compare-and-swap, and the adds the pipeline returns
are re-sent to the replacements. If the CAS finds the ledger CLOSED every pending add fails
with LedgerClosedError, if IN_RECOVERY with LedgerFencedError — as does a FENCED answer from
any bookie: another client is recovering the ledger and this writer must stop.

After ``explicit_lac_interval_s`` without adds, the writer sends its LAC to the ensemble
(WRITE_LAC) so tailing readers see the last entry; with guaranteed write quorum, its LAFR
(WRITE_LAFR) every ``explicit_lac_interval_s`` when it moved.

:class:`WriterEnsemble` is a part of :class:`~bookkeeper_aio.client.writer.LedgerWriter` (a
mixin: one concept per module); the add path whose failed bookies it replaces is in
``writer_adds.py``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..digest import LacProof
from ..errors import BookKeeperError, LedgerClosedError, LedgerFencedError, WriteQuorumTimeoutError
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import WriteLacRequest, WriteLafrRequest
from .add_pipeline import AddPipeline, PendingAdd
from .context import ClientContext
from .short_copies import ShortCopies

log = logging.getLogger(__name__)


class WriterEnsemble:
    """The ensemble part of a ledger writer (see the module docstring). The state is
    :class:`~.writer.LedgerWriter`'s (its ``__init__``)."""

    ctx: ClientContext
    ledger_id: int
    _versioned: Versioned
    _key: bytes
    _ensemble: list[str]
    _wq: int
    _pipe: AddPipeline
    _loop: asyncio.AbstractEventLoop
    _failed: BaseException | None
    _backlog_credit: int
    _queued: dict[int, list[PendingAdd]]
    _queued_bytes: dict[int, int]
    _change_task: asyncio.Task[None] | None
    _ensemble_changes: int
    _idle: bool
    _lac_sent: int
    _lafr_sent: int
    _short: ShortCopies

    if TYPE_CHECKING:  # the add path's (writer_adds.py)

        def _send(self, op: PendingAdd, index: int) -> None: ...

        def _complete(self) -> None: ...

        def _fail(self, exc: BaseException) -> None: ...

        def _retry_later(self, op: PendingAdd, index: int, bookie: str) -> bool: ...

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


def _ignore(result: Any) -> None:
    """Explicit LAC and LAFR writes are best effort: a reader falls back to the piggybacked
    LAC, a recovery to the first entry of the last segment."""
