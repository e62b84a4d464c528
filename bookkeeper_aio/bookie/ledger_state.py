"""A bookie's view of one ledger: its state machine and what it caches in memory.

Theory of operation
-------------------
A bookie knows a ledger through its :class:`~bookkeeper_aio.engine.LedgerInfo` (master key,
fenced, limbo, explicit LAC) and the entries it holds. :class:`LedgerView` names the four
states that matter to the protocol; :data:`TRANSITIONS` is the complete table of legal moves
and :func:`transition` raises on anything else, so a code path that, say, unfences a ledger is
a crash in tests rather than a silent safety bug.

* ACTIVE  — normal adds accepted.
* FENCED  — a recoverer fenced it: only recovery adds are accepted (BookKeeper's fencing).
* LIMBO   — fenced *and* the bookie may have lost entries (BP-46): it must never answer an
  explicit negative (no-such-entry / no-such-ledger) because the entry may have existed.
* DELETED — garbage-collected; a later request sees an unknown ledger again.

:class:`LedgerState` is the in-memory cache the request handler works on: the state, the master
key, the best :class:`~bookkeeper_aio.digest.LacProof` seen (the highest LAC from a stored
entry header or an explicit LAC record) and the long-poll reads parked on the LAC. The engine
is the truth after a restart; this cache is rebuilt from it lazily.
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from ..digest import ENTRY_RECORD_HEADER, NO_ENTRY, LacProof
from ..engine import LedgerInfo

log = logging.getLogger(__name__)


class LedgerView(enum.Enum):
    """The protocol state of a ledger on one bookie."""

    ACTIVE = "active"
    FENCED = "fenced"
    LIMBO = "limbo"
    DELETED = "deleted"


TRANSITIONS: frozenset[tuple[LedgerView, LedgerView]] = frozenset(
    {
        (LedgerView.ACTIVE, LedgerView.FENCED),  # a recoverer's fencing read
        (LedgerView.ACTIVE, LedgerView.LIMBO),  # BP-46 boot: possibly lost data
        (LedgerView.FENCED, LedgerView.LIMBO),
        (LedgerView.LIMBO, LedgerView.FENCED),  # BP-46 repair finished; stays fenced
        (LedgerView.ACTIVE, LedgerView.DELETED),
        (LedgerView.FENCED, LedgerView.DELETED),
        (LedgerView.LIMBO, LedgerView.DELETED),
        (LedgerView.DELETED, LedgerView.ACTIVE),  # the id is reused by a new first add
        (LedgerView.DELETED, LedgerView.FENCED),  # ... or by a fence
    }
)


class IllegalTransitionError(AssertionError):
    """A programmer error: the code tried a state change the protocol forbids."""


def transition(current: LedgerView, target: LedgerView) -> LedgerView:
    """Return ``target`` if moving there from ``current`` is legal (or a no-op).

    Raises:
        IllegalTransitionError: the pair is not in :data:`TRANSITIONS`.
    """
    if current is target or (current, target) in TRANSITIONS:
        return target
    raise IllegalTransitionError(f"ledger state {current.value} -> {target.value} is illegal")


def view_of(info: LedgerInfo) -> LedgerView:
    """The state a stored :class:`LedgerInfo` describes."""
    if info.limbo:
        return LedgerView.LIMBO
    return LedgerView.FENCED if info.fenced else LedgerView.ACTIVE


_PROOF = struct.Struct(">qqQQ")


def pack_proof(proof: LacProof) -> bytes:
    """The bytes of a LAC proof, as kept in ``LedgerInfo.explicit_lac`` and the journal."""
    return _PROOF.pack(*proof)


def unpack_proof(data: bytes) -> LacProof | None:
    """Inverse of :func:`pack_proof`; None for empty bytes."""
    return LacProof(*_PROOF.unpack(data)) if data else None


def proof_from_record(entry_id: int, record: bytes) -> LacProof:
    """The LAC proof carried by a stored entry record (its digest-protected header)."""
    lac, pdigest, digest = ENTRY_RECORD_HEADER.unpack_from(record)
    return LacProof(entry_id, lac, pdigest, digest)


Waiter = Callable[[], None]


@dataclass(eq=False)
class LedgerState:
    """What the handler keeps in memory about one ledger (see the module docstring)."""

    ledger_id: int
    master_key: bytes
    view: LedgerView = LedgerView.ACTIVE
    lac_proof: LacProof | None = None
    explicit_lac: LacProof | None = None
    fence_durable: bool = True  # False while a fence's journal record is not yet synced
    # Guaranteed write quorum: the highest LAFR a writer sent (WriteLafrRequest). A hint for
    # a recovery's starting point, in memory only: after a restart -1, and a recovery then
    # starts at the last segment's first entry, which is always correct.
    lafr: int = -1
    # Long polls parked on the LAC, each keyed by itself (removed in O(1) when it expires).
    waiters: dict[object, Waiter] = field(default_factory=dict)

    @property
    def fenced(self) -> bool:
        """Fenced or in limbo: normal adds are refused."""
        return self.view is LedgerView.FENCED or self.view is LedgerView.LIMBO

    @property
    def lac(self) -> int:
        """The highest LAC this bookie holds for the ledger (-1 if none)."""
        return self.lac_proof.lac if self.lac_proof is not None else NO_ENTRY

    def move_to(self, target: LedgerView) -> None:
        """Change state through the transition table."""
        self.view = transition(self.view, target)

    def offer_lac(self, proof: LacProof) -> bool:
        """Keep ``proof`` if its LAC is higher than the best one; True if the LAC advanced."""
        if self.lac_proof is not None and proof.lac <= self.lac_proof.lac:
            return False
        self.lac_proof = proof
        return True

    def info(
        self,
        view: LedgerView | None = None,
        *,
        master_key: bytes | None = None,
        explicit_lac: LacProof | None = None,
    ) -> LedgerInfo:
        """The persistent part of this state, as the engine stores it; the arguments give it
        as it will be after a change (the engine stores it before the cache changes)."""
        view = self.view if view is None else transition(self.view, view)
        explicit_lac = explicit_lac or self.explicit_lac
        return LedgerInfo(
            master_key=self.master_key if master_key is None else master_key,
            fenced=view is LedgerView.FENCED or view is LedgerView.LIMBO,
            limbo=view is LedgerView.LIMBO,
            explicit_lac=pack_proof(explicit_lac) if explicit_lac else b"",
        )

    @property
    def evictable(self) -> bool:
        """Nothing but the engine is needed to rebuild it: no parked reads, no fence record
        still being synced."""
        return not self.waiters and self.fence_durable

    @classmethod
    def load(
        cls, ledger_id: int, info: LedgerInfo, last_record: tuple[int, bytes] | None
    ) -> LedgerState:
        """Rebuild the cache from the engine: the info and the last stored entry, if any."""
        state = cls(ledger_id, info.master_key, view_of(info))
        state.explicit_lac = unpack_proof(info.explicit_lac)
        if state.explicit_lac is not None:
            state.offer_lac(state.explicit_lac)
        if last_record is not None:
            state.offer_lac(proof_from_record(*last_record))
        return state

    def wake_waiters(self) -> None:
        """Run (and forget) every parked long poll; each re-checks the LAC itself. One that
        raises is logged; the others still run (none is stranded)."""
        waiters, self.waiters = self.waiters, {}
        for wake in waiters.values():
            try:
                wake()
            except Exception:
                log.exception("ledger %d: a parked read failed to wake", self.ledger_id)
