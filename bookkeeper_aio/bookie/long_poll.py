"""Long-poll reads parked on a ledger's LAC, and the peer a request came from.

Theory of operation
-------------------
A long-poll read (``READ_FLAG_LONG_POLL``) whose ledger's LAC has not passed the reader's
``previous_lac`` is *parked*: a :class:`LongPoll` waits in the ledger's ``waiters`` until the
LAC passes, the ledger is fenced or deleted (the handler wakes the waiters), or its timer
expires. Then it gives up its slot and its answer is produced when its peer can take it.

Slots are bounded twice: ``long_poll_parked_max`` in the whole bookie and
``connection_long_polls_max`` per connection, so no one connection can take them all. A
connection that goes away drops its parked polls at once (:meth:`Peer.drop_long_polls`):
their slots do not wait for the timers of answers nobody will read.

:class:`Peer` is the connection as the handler sees it. Its :meth:`Peer.defer` is where an
answer produced later (a long poll's, a read that waited for its fence to be durable) is
made: the base class makes it at once; a bookie connection holds it while its peer is not
reading (``connection.py``), so answers to reads are never queued without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from .ledger_state import LedgerState, LedgerView

if TYPE_CHECKING:
    from .handler_state import HandlerState


class Peer:
    """Where a request came from (see the module docstring); the base runs deferred work at
    once (tests, tools, the parts of a multi-add)."""

    def __init__(self) -> None:
        self.long_polls: dict[LongPoll, None] = {}  # parked by this peer, in order

    def defer(self, work: Callable[[], None]) -> None:
        """Run ``work`` (which produces an answer) when the peer can take it."""
        work()

    def drop_long_polls(self) -> None:
        """The peer is gone: free the slots of its parked long polls without answering."""
        for poll in list(self.long_polls):
            poll.cancel()


class LongPoll:
    """One parked long-poll read (see the module docstring)."""

    __slots__ = ("answer", "handler", "peer", "previous_lac", "state", "timer")

    def __init__(
        self,
        handler: HandlerState,
        state: LedgerState,
        previous_lac: int,
        timeout_s: float,
        answer: Callable[[], None],
        peer: Peer,
    ) -> None:
        self.handler, self.state, self.previous_lac = handler, state, previous_lac
        self.answer, self.peer = answer, peer
        handler.parked += 1
        peer.long_polls[self] = None
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self.expire)
        state.waiters[self] = self.wake

    @staticmethod
    def ready(state: LedgerState, previous_lac: int) -> bool:
        """Whether a long poll after ``previous_lac`` can be answered now."""
        return state.lac > previous_lac or state.fenced or state.view is LedgerView.DELETED

    def wake(self) -> None:
        """The ledger changed (its waiters were run): answer, or wait again."""
        if self.ready(self.state, self.previous_lac):
            self._release()
            self.peer.defer(self.answer)
        else:
            self.state.waiters[self] = self.wake

    def expire(self) -> None:
        """The timeout passed: answer with whatever the bookie has."""
        if self.state.waiters.pop(self, None) is not None:
            self._release()
            self.peer.defer(self.answer)

    def cancel(self) -> None:
        """Forget this poll without answering (its peer is gone)."""
        if self.state.waiters.pop(self, None) is not None:
            self._release()

    def _release(self) -> None:
        self.timer.cancel()
        self.handler.parked -= 1
        self.peer.long_polls.pop(self, None)

    def __repr__(self) -> str:
        return f"LongPoll(ledger {self.state.ledger_id} after LAC {self.previous_lac})"
