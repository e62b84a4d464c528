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
* **ClosedLedgerEntriesAtWriteQuorum** — guaranteed write quorum ledgers (seed 001): every
  entry of a closed one, and every entry outside the last segment of an open one, has WQ
  copies in its write set; and at every metadata change, every acknowledged entry still has
  AQ copies in the ensemble the new metadata assigns it (what pinning guarantees). Only in
  runs whose crashes cannot lose acknowledged data, like AllCommittedEntriesReachAckQuorum.
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
        if quorum_check and md.guaranteed_write_quorum:
            ClosedLedgerEntriesAtWriteQuorum(world, history).check(md)


class ClosedLedgerEntriesAtWriteQuorum:
    """Guaranteed write quorum's invariant (see the module docstring).

    :meth:`check` runs with the other state invariants; :meth:`install` also checks every
    metadata change the moment it is written (an ensemble change that swapped out a bookie
    holding an acknowledged entry below WQ is visible only until the replacement stores it).
    """

    NAME = "ClosedLedgerEntriesAtWriteQuorum"

    def __init__(self, world: World, history: History) -> None:
        self.world = world
        self.history = history

    def install(self) -> None:
        """Chain :meth:`on_metadata` after the world's metadata observer."""
        previous = self.world.state.on_metadata

        def observe(ledger_id: int, versioned: Versioned | None) -> None:
            if previous is not None:
                previous(ledger_id, versioned)
            if versioned is not None and versioned.value.guaranteed_write_quorum:
                self.on_metadata(versioned.value)

        self.world.state.on_metadata = observe

    def check(self, md: LedgerMetadata) -> None:
        """WQ copies of every entry of a closed ledger / outside an open one's last segment."""
        last = md.last_entry_id if md.is_closed else md.ensembles[-1][0] - 1
        sent = self.history.ledger(md.ledger_id).sent
        for entry_id in range(last + 1):
            holders = self._holders(md, entry_id, sent.get(entry_id))
            if holders is not None and len(holders) < md.write_quorum:
                where = "closed" if md.is_closed else "outside the last segment of open"
                self.history.violate(
                    self.NAME,
                    f"ledger {md.ledger_id} entry {entry_id} ({where} ledger): only "
                    f"{holders} hold it (WQ {md.write_quorum})",
                )
                return

    def on_metadata(self, md: LedgerMetadata) -> None:
        """At a metadata change: acknowledged entries keep AQ copies in their ensemble."""
        h = self.history.ledgers.get(md.ledger_id)
        if h is None:
            return
        self.check(md)
        for entry_id in range(md.ensembles[-1][0], h.last_acked + 1):
            holders = self._holders(md, entry_id, h.sent.get(entry_id))
            if holders is not None and len(holders) < md.ack_quorum:
                self.history.violate(
                    self.NAME,
                    f"ledger {md.ledger_id} entry {entry_id}: acknowledged, and the new "
                    f"ensemble {md.ensembles[-1][1]} leaves it on {holders} (AQ "
                    f"{md.ack_quorum}): a bookie that held it was swapped out",
                )
                return

    def _holders(
        self, md: LedgerMetadata, entry_id: int, payload: bytes | None
    ) -> list[str] | None:
        """The members of the entry's write set holding it; None if a member's disk is gone
        for good (what it held is unknowable, and not the protocol's doing)."""
        ensemble = md.ensemble_at(entry_id)
        holders = []
        for i in write_set(entry_id, md.ensemble_size, md.write_quorum):
            node = self.world.bookie_at(ensemble[i])
            if node is not None and (node.lost or node.disk.failed):
                return None
            if _holds(self.world, ensemble[i], md, entry_id, payload):
                holders.append(ensemble[i])
        return holders


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
