"""A log writer's lifecycle states and its current ledger as offsets.

Theory of operation
-------------------
:class:`WriterState` is the log writer's lifecycle as a transition table (STYLE 21): NEW →
OPENING (the takeover) → ACTIVE ⇄ ROLLING (switching to the next ledger) → CLOSING → CLOSED,
and FENCED (another writer took over) or FAILED from any working state.

:class:`Segment` is the ledger a writer appends to, seen as offsets: entry *e* is offset
``first_offset + e``. It hands each record to the ledger writer's ``append_callback`` with one
bound method for all of them, and keeps whom to tell (a future or a callback) in a queue: the
ledger writer completes entries strictly in order, so the head of the queue is always the
entry being told about. No object per record besides the ledger writer's own.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Callable
from typing import Any

from ..client.writer import LedgerWriter
from ..errors import IllegalLedgerTransitionError

log = logging.getLogger(__name__)

AppendCallback = Callable[[int, BaseException | None], None]


class WriterState(enum.Enum):
    """A log writer's lifecycle (see the module docstring)."""

    NEW = "NEW"
    OPENING = "OPENING"
    ACTIVE = "ACTIVE"
    ROLLING = "ROLLING"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    FENCED = "FENCED"
    FAILED = "FAILED"


_S = WriterState
MOVES: dict[WriterState, frozenset[WriterState]] = {
    _S.NEW: frozenset({_S.OPENING, _S.CLOSED}),
    _S.OPENING: frozenset({_S.ACTIVE, _S.FENCED, _S.FAILED, _S.CLOSED}),
    _S.ACTIVE: frozenset({_S.ROLLING, _S.CLOSING, _S.FENCED, _S.FAILED, _S.CLOSED}),
    _S.ROLLING: frozenset({_S.ACTIVE, _S.FENCED, _S.FAILED, _S.CLOSED}),
    _S.CLOSING: frozenset({_S.CLOSED, _S.FENCED, _S.FAILED}),
    _S.FENCED: frozenset({_S.CLOSED}),
    _S.FAILED: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}


def check_move(name: str, old: WriterState, new: WriterState) -> None:
    """Raise unless ``old -> new`` is in :data:`MOVES`.

    Raises:
        IllegalLedgerTransitionError: a move the table does not allow (a bug).
    """
    if new not in MOVES[old]:
        raise IllegalLedgerTransitionError(f"log writer of {name}: {old.value} -> {new.value}")


class Segment:
    """See the module docstring. ``on_error(error)`` turns a ledger error into the one the
    caller gets (and lets the log writer change state)."""

    __slots__ = (
        "aged", "bytes", "entries", "first_offset", "on_entry", "on_error", "waiting", "writer"
    )  # fmt: skip

    def __init__(
        self,
        writer: LedgerWriter,
        first_offset: int,
        on_error: Callable[[BaseException], BaseException],
    ) -> None:
        self.writer = writer
        self.first_offset = first_offset
        self.on_error = on_error
        self.entries = 0  # records handed to the ledger (acknowledged or not)
        self.bytes = 0
        self.aged = False  # segment_age_s passed since its first record: roll over
        self.waiting: collections.deque[Any] = collections.deque()
        self.on_entry = self._on_entry  # one bound method for every record

    @property
    def ledger_id(self) -> int:
        return self.writer.ledger_id

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.entries

    def push(self, payload: bytes, whom: Any) -> int:
        """Hand ``payload`` to the ledger; return its offset. ``whom`` is told later.

        Raises:
            whatever ``LedgerWriter.append_callback`` raises (then ``whom`` is never told).
        """
        self.waiting.append(whom)
        try:
            self.writer.append_callback(payload, self.on_entry)
        except BaseException:
            self.waiting.pop()
            raise
        self.entries += 1
        self.bytes += len(payload)
        return self.first_offset + self.entries - 1

    def _on_entry(self, entry_id: int, error: BaseException | None) -> None:
        whom = self.waiting.popleft()
        offset = self.first_offset + entry_id
        if error is not None:
            error = self.on_error(error)
        tell(whom, offset, error)


def tell(whom: Any, offset: int, error: BaseException | None) -> None:
    """Resolve a future, or call a callback (whose exceptions are logged, not raised: the
    caller's bug must not break the writer's bookkeeping)."""
    if isinstance(whom, asyncio.Future):
        if whom.done():
            return  # cancelled by its caller
        if error is None:
            whom.set_result(offset)
        else:
            whom.set_exception(error)
            whom.exception()  # the caller may have dropped it: not "never retrieved"
        return
    try:
        whom(offset, error)
    except Exception:
        log.exception("append callback of offset %d raised", offset)
