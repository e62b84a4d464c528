"""The invariants of BookKeeper's TLA+ specification, checked against a simulated run.

Theory of operation
-------------------
The workload records what clients were told (:class:`History`): what each writer sent and
which entries were acknowledged, in what order; what readers read; how writers closed. The
world records every version of every ledger's metadata. The checkers compare these with each
other and with the bookies' storage (the god's view of :class:`~bookkeeper_aio.sim.world.World`)
and report :class:`Violation` objects, named after the TLA+ invariants
(``../shared/reference/bookkeeper.md`` §6):

* **NoDivergenceBetweenClientAndMetaData** — a closed ledger ends at or after every entry a
  writer got acknowledged, and exactly at the LAC of a writer that closed it itself.
* **AllAckedEntriesAreReadable** — every acknowledged entry (and every entry of a closed
  ledger) is held, with the payload the writer sent, by a bookie of its write set in the
  ensemble the metadata assigns to it.
* **AllCommittedEntriesReachAckQuorum** — the same, by at least AQ of them (only for runs
  whose crashes cannot lose acknowledged data).
* **NoOutOfOrderEntries** — a writer's acknowledgements come in entry-id order without gaps;
  what a reader gets is what the writer sent under that id, in order.
* **OnlyValidFragments** — a ledger's segments before its last one never change, and no new
  segment starts before the last one (BookKeeper #2615).
* **Liveness** — after the faults stop, every ledger gets closed and read back in bounded time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..quorum import write_set

if TYPE_CHECKING:
    from .world import World


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str
    time_s: float

    def __str__(self) -> str:
        return f"[t={self.time_s:.3f}s] {self.invariant}: {self.detail}"


@dataclass
class LedgerHistory:
    """What clients were told about one ledger."""

    ledger_id: int
    sent: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload the writer sent
    acked: list[int] = field(default_factory=list)  # in acknowledgement order
    writer_closed_at: int | None = None  # the LAC of a writer whose close() succeeded

    @property
    def last_acked(self) -> int:
        return max(self.acked, default=-1)


class History:
    """Client-side observations plus a short trace for failure reports."""

    def __init__(self, clock: Callable[[], float], trace_max: int = 80) -> None:
        self.clock = clock
        self.ledgers: dict[int, LedgerHistory] = {}
        self.trace: deque[str] = deque(maxlen=trace_max)
        self.violations: list[Violation] = []
        self.metadata: dict[int, LedgerMetadata] = {}  # last version seen of each ledger
        self.first_trace: list[str] | None = None
        self._reported: set[tuple[str, str]] = set()
        # Autorecovery replaced bookies of a finished fragment (sim/autorecovery.py checks it).
        self.on_replacement: Callable[[LedgerMetadata, LedgerMetadata], None] | None = None

    def note(self, text: str) -> None:
        self.trace.append(f"{self.clock():9.3f}  {text}")

    def violate(self, invariant: str, detail: str) -> None:
        """Record a violation (once per invariant and ledger: the first is the informative
        one); the trace up to the first violation is kept for the report."""
        key = (invariant, detail.split(":")[0])
        if key in self._reported or len(self.violations) >= 20:
            return
        self._reported.add(key)
        self.violations.append(Violation(invariant, detail, self.clock()))
        self.note(f"VIOLATION {invariant}: {detail}")
        if self.first_trace is None:
            self.first_trace = list(self.trace)

    def ledger(self, ledger_id: int) -> LedgerHistory:
        return self.ledgers.setdefault(ledger_id, LedgerHistory(ledger_id))

    # --- events ---------------------------------------------------------------------------

    def sent(self, ledger_id: int, entry_id: int, payload: bytes) -> None:
        self.ledger(ledger_id).sent[entry_id] = payload

    def acked(self, ledger_id: int, entry_id: int) -> None:
        h = self.ledger(ledger_id)
        if entry_id != h.last_acked + 1:
            self.violate(
                "NoOutOfOrderEntries",
                f"ledger {ledger_id}: entry {entry_id} acknowledged after {h.last_acked}",
            )
        h.acked.append(entry_id)
        md = self.metadata.get(ledger_id)
        if md is not None and md.is_closed and entry_id > md.last_entry_id:
            self.violate(
                "NoDivergenceBetweenClientAndMetaData",
                f"ledger {ledger_id}: entry {entry_id} acknowledged after the ledger "
                f"was closed at {md.last_entry_id}",
            )

    def writer_closed(self, ledger_id: int, lac: int) -> None:
        self.ledger(ledger_id).writer_closed_at = lac
        self.note(f"writer closed ledger {ledger_id} at {lac}")

    def read(self, reader: str, ledger_id: int, entry_id: int, payload: bytes) -> None:
        expected = self.ledger(ledger_id).sent.get(entry_id)
        if expected != payload:
            self.violate(
                "NoOutOfOrderEntries",
                f"{reader} read entry {entry_id} of ledger {ledger_id} with a payload "
                f"the writer never sent under that id",
            )

    def metadata_written(self, ledger_id: int, versioned: Versioned | None) -> None:
        if versioned is None:
            self.metadata.pop(ledger_id, None)
            return
        new, old = versioned.value, self.metadata.get(ledger_id)
        if old is not None:
            check_fragments(self, old, new)
        self.metadata[ledger_id] = new
        if new.state is not (old.state if old else None) or (
            old is not None and len(new.ensembles) != len(old.ensembles)
        ):
            end = f" last entry {new.last_entry_id}" if new.is_closed else ""
            self.note(
                f"metadata of {ledger_id}: {new.state.name}{end}, "
                f"segments {[f for f, _ in new.ensembles]}"
            )


def check_fragments(history: History, old: LedgerMetadata, new: LedgerMetadata) -> None:
    """OnlyValidFragments: segments before the last are immutable; none starts before it."""
    lid = old.ledger_id
    last_first = old.ensembles[-1][0]
    if history.on_replacement is not None and is_replica_replacement(old, new):
        history.on_replacement(old, new)
        return
    if tuple(new.ensembles[: len(old.ensembles) - 1]) != tuple(old.ensembles[:-1]):
        history.violate(
            "OnlyValidFragments",
            f"ledger {lid}: an earlier segment changed: {old.ensembles} -> {new.ensembles}",
        )
    for first, _ in new.ensembles[len(old.ensembles) - 1 :]:
        if first < last_first:
            history.violate(
                "OnlyValidFragments",
                f"ledger {lid}: new segment at {first} before the last one at {last_first}",
            )
    if new.is_closed and new.last_entry_id < new.ensembles[-1][0] - 1:
        history.violate(
            "OnlyValidFragments",
            f"ledger {lid}: closed at {new.last_entry_id} "
            f"before its last segment at {new.ensembles[-1][0]}",
        )


def is_replica_replacement(old: LedgerMetadata, new: LedgerMetadata) -> bool:
    """Autorecovery's only change: bookies swapped in segments whose end was known (every
    segment but the last of a ledger not CLOSED); nothing else moved."""
    if (old.state, old.last_entry_id, len(old.ensembles)) != (
        new.state,
        new.last_entry_id,
        len(new.ensembles),
    ):
        return False
    changed = [
        position
        for position, (a, b) in enumerate(zip(old.ensembles, new.ensembles, strict=True))
        if a != b
    ]
    same_firsts = all(a[0] == b[0] for a, b in zip(old.ensembles, new.ensembles, strict=True))
    finished = old.is_closed or len(old.ensembles) - 1 not in changed
    return bool(changed) and same_firsts and finished


def check_all(world: World, history: History, *, quorum_check: bool) -> None:
    """Run every state invariant once (cheap enough to run after every step)."""
    for lid, h in history.ledgers.items():
        versioned = world.ledger(lid)
        if versioned is None:
            continue
        md = versioned.value
        _no_divergence(history, md, h)
        _readable(world, history, md, h, quorum_check=quorum_check)


def _no_divergence(history: History, md: LedgerMetadata, h: LedgerHistory) -> None:
    if md.state is not LedgerState.CLOSED:
        return
    if h.last_acked > md.last_entry_id:
        history.violate(
            "NoDivergenceBetweenClientAndMetaData",
            f"ledger {md.ledger_id} closed at {md.last_entry_id} but entry "
            f"{h.last_acked} was acknowledged",
        )
    if h.writer_closed_at is not None and h.writer_closed_at != md.last_entry_id:
        history.violate(
            "NoDivergenceBetweenClientAndMetaData",
            f"ledger {md.ledger_id}: the writer closed at {h.writer_closed_at}, "
            f"metadata says {md.last_entry_id}",
        )


def _readable(
    world: World, history: History, md: LedgerMetadata, h: LedgerHistory, *, quorum_check: bool
) -> None:
    last = md.last_entry_id if md.state is LedgerState.CLOSED else h.last_acked
    last = max(last, h.last_acked)
    for entry_id in range(last + 1):
        payload = h.sent.get(entry_id)
        ensemble = md.ensemble_at(entry_id)
        members = write_set(entry_id, md.ensemble_size, md.write_quorum)
        holders = [
            ensemble[i] for i in members if _holds(world, ensemble[i], md, entry_id, payload)
        ]
        if not holders:
            history.violate(
                "AllAckedEntriesAreReadable",
                f"ledger {md.ledger_id} entry {entry_id}: no bookie of "
                f"{[ensemble[i] for i in members]} holds it",
            )
            return
        if quorum_check and len(holders) < md.ack_quorum:
            history.violate(
                "AllCommittedEntriesReachAckQuorum",
                f"ledger {md.ledger_id} entry {entry_id}: only {holders} hold it "
                f"(AQ {md.ack_quorum})",
            )
            return


def _holds(
    world: World, address: str, md: LedgerMetadata, entry_id: int, payload: bytes | None
) -> bool:
    node = world.bookie_at(address)
    if node is None:
        return False
    stored = node.stored(md.ledger_id, entry_id)
    return stored is not None and (payload is None or stored == payload)
