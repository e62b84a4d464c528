"""The invariants of a log made of chained ledgers, checked against a simulated run.

Theory of operation
-------------------
The log agents (``sim/logs.py``) report what clients were told: each record sent (in a global
send order), each acknowledgement (offset, and the ledger and entry the writer put it in),
each record a reader or ``read_log`` returned. Every version of every log's key is reported as
it is written (``World``'s key hook). Acknowledged records are also registered with the ledger
:class:`~bookkeeper_aio.sim.checkers.History`, so the ledger invariants (every acknowledged
entry held by its write set, ...) cover the log's ledgers too. The checks, named after
``LedgerChaining.tla`` (../shared/reference/bookkeeper.md §6) and two of our own:

* **AllNonEmptyLedgersInLedgerList** — every ledger a writer got an acknowledgement from is in
  the log's list (or was removed from its front), and no ledger tagged with the log outside
  the list holds an entry.
* **EntryOrderMaintained** — no later ledger of the list holds an earlier write: every
  acknowledged record of a ledger was sent before every acknowledged record of the ledgers
  after it.
* **OnlyOneLedgerOpenAtATime** — of the ledgers in the list, at most the last one is not
  CLOSED in its own metadata.
* **LogOffsetsDenseAndStable** — a writer's acknowledgements are consecutive offsets from its
  first; an offset always carries the same record (acknowledged or read, by anyone, ever); the
  log maps an acknowledged offset to the ledger entry its writer wrote it to; readers get
  consecutive offsets; closed segments never change; segments only leave from the front.
* **AllAckedLogRecordsReadable** — every acknowledged offset not truncated lies inside the
  log (not past the end of a closed segment) and, after the faults, reads back through
  ``read_log`` with its payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import MetadataFormatError
from ..logs.model import LogMetadata
from ..logs.options import LOGS_PREFIX
from ..metadata.model import LedgerState, Versioned

if TYPE_CHECKING:
    from .checkers import History
    from .world import World


@dataclass
class Acked:
    """One acknowledged record, as its writer saw it."""

    payload: bytes
    seq: int  # its place in the send order of the log
    ledger_id: int
    entry_id: int


@dataclass
class LogHistory:
    """What clients were told about one log."""

    name: str
    sent: dict[bytes, int] = field(default_factory=dict)  # payload -> send order
    acked: dict[int, Acked] = field(default_factory=dict)  # offset -> record
    seen: dict[int, bytes] = field(default_factory=dict)  # offset -> payload, any source
    sessions: dict[str, int] = field(default_factory=dict)  # writer -> next offset expected
    written: dict[int, tuple[int, int]] = field(default_factory=dict)  # ledger -> seq min, max
    removed: set[int] = field(default_factory=set)  # ledgers that left the list's front
    closed: dict[int, tuple[int, int]] = field(default_factory=dict)  # ledger -> first, entries
    # A job's ledgers are written elsewhere and join the log in one step: they count as
    # written when the compare-and-swap that appends them lands (their send order then).
    committed: dict[int, int | None] = field(default_factory=dict)  # ledger -> send order
    md: LogMetadata | None = None  # the last version written


class LogChecks:
    """See the module docstring; ``history`` carries the violations and the trace."""

    def __init__(self, world: World, history: History) -> None:
        self.world = world
        self.history = history
        self.logs: dict[str, LogHistory] = {}

    def log(self, name: str) -> LogHistory:
        return self.logs.setdefault(name, LogHistory(name))

    def _violate(self, invariant: str, name: str, detail: str) -> None:
        self.history.violate(invariant, f"log {name}: {detail}")

    # --- events ---------------------------------------------------------------------------

    def sent(self, name: str, payload: bytes) -> None:
        h = self.log(name)
        h.sent[payload] = len(h.sent)

    def commit_started(self, name: str, ledger_ids: list[int]) -> None:
        """A job is about to append these ledgers (see ``LogHistory.committed``)."""
        self.log(name).committed.update(dict.fromkeys(ledger_ids))

    def session_opened(self, name: str, writer: str, first_offset: int) -> None:
        self.log(name).sessions[writer] = first_offset

    def acked(
        self, name: str, writer: str, offset: int, payload: bytes, ledger_id: int, entry_id: int
    ) -> None:
        h = self.log(name)
        expected = h.sessions.get(writer)
        if expected is not None and offset != expected:
            self._violate(
                "LogOffsetsDenseAndStable", name,
                f"{writer} got offset {offset} acknowledged, expected {expected}",
            )  # fmt: skip
        h.sessions[writer] = offset + 1
        self._same_record(h, offset, payload, f"acknowledged to {writer}")
        seq = h.committed.get(ledger_id) or h.sent.get(payload, -1)
        h.acked[offset] = Acked(payload, seq, ledger_id, entry_id)
        low, high = h.written.get(ledger_id, (seq, seq))
        h.written[ledger_id] = (min(low, seq), max(high, seq))
        ledger = self.history.ledger(ledger_id)  # the ledger invariants cover it too
        ledger.sent[entry_id] = payload
        self.history.acked(ledger_id, entry_id)

    def read(self, name: str, reader: str, offset: int, payload: bytes) -> None:
        h = self.log(name)
        if payload not in h.sent:
            self._violate(
                "LogOffsetsDenseAndStable", name,
                f"{reader} read offset {offset}: a record nobody sent",
            )  # fmt: skip
        self._same_record(h, offset, payload, f"read by {reader}")

    def _same_record(self, h: LogHistory, offset: int, payload: bytes, how: str) -> None:
        before = h.seen.setdefault(offset, payload)
        if before != payload:
            self._violate(
                "LogOffsetsDenseAndStable", h.name,
                f"offset {offset} {how} is {payload!r}, but it was {before!r}",
            )  # fmt: skip

    def key_written(self, key: str, versioned: Versioned[bytes] | None) -> None:
        """Every version of a log's key, as it is stored."""
        name = key[len(LOGS_PREFIX) :]
        if not key.startswith(LOGS_PREFIX) or "/" in name or versioned is None:
            return
        try:
            md = LogMetadata.from_json_bytes(versioned.value)
        except MetadataFormatError as exc:
            self._violate("LogOffsetsDenseAndStable", name, f"unreadable metadata: {exc}")
            return
        h = self.log(name)
        old, h.md = h.md, md
        if old is not None:
            self._list_moves(h, old, md)
        for ledger_id in md.ledger_ids:
            if ledger_id in h.committed and h.committed[ledger_id] is None:
                h.committed[ledger_id] = len(h.sent)  # written now, as a whole
                h.sent[b"commit of %d" % ledger_id] = len(h.sent)
        self._only_one_open(h)

    def _list_moves(self, h: LogHistory, old: LogMetadata, new: LogMetadata) -> None:
        """Closed segments never change; the list only loses segments at its front."""
        old_ids, new_ids = old.ledger_ids, new.ledger_ids
        kept = [i for i in old_ids if i in new_ids]
        if old_ids[len(old_ids) - len(kept) :] != tuple(kept) or new_ids[: len(kept)] != tuple(
            kept
        ):
            self._violate(
                "LogOffsetsDenseAndStable", h.name, f"the list went {old_ids} -> {new_ids}"
            )
        h.removed.update(set(old_ids) - set(new_ids))
        if new.start_offset < old.start_offset:
            self._violate(
                "LogOffsetsDenseAndStable", h.name,
                f"start offset went back {old.start_offset} -> {new.start_offset}",
            )  # fmt: skip
        for segment in new.segments:
            if segment.is_open:
                continue
            fixed = (segment.first_offset, segment.entries or 0)
            if h.closed.setdefault(segment.ledger_id, fixed) != fixed:
                self._violate(
                    "LogOffsetsDenseAndStable", h.name,
                    f"closed segment {segment.ledger_id} moved "
                    f"{h.closed[segment.ledger_id]} -> {fixed}",
                )  # fmt: skip

    # --- state checks ---------------------------------------------------------------------

    def check(self, *, scan: bool = False) -> None:
        """The state invariants of every log (``scan``: also look for written ledgers
        outside the list, a slower god's-view scan)."""
        for h in self.logs.values():
            if h.md is None or h.md.deleting:
                continue
            self._only_one_open(h)
            self._in_list(h)
            self._order(h)
            self._mapped(h)
            if scan:
                self._unlisted_written(h)

    def _only_one_open(self, h: LogHistory) -> None:
        assert h.md is not None
        ids = h.md.ledger_ids
        not_closed = [
            i for i in ids if (v := self.world.ledger(i)) is not None and not v.value.is_closed
        ]
        if not_closed and not_closed != [ids[-1]]:
            states = {i: _state(self.world, i) for i in ids}
            self._violate("OnlyOneLedgerOpenAtATime", h.name, f"ledgers of the list: {states}")

    def _in_list(self, h: LogHistory) -> None:
        assert h.md is not None
        listed = set(h.md.ledger_ids) | h.removed
        for ledger_id in h.written:
            if ledger_id not in listed:
                self._violate(
                    "AllNonEmptyLedgersInLedgerList", h.name,
                    f"ledger {ledger_id} acknowledged records but is not in the list "
                    f"{h.md.ledger_ids}",
                )  # fmt: skip

    def _unlisted_written(self, h: LogHistory) -> None:
        assert h.md is not None
        listed = set(h.md.ledger_ids) | h.removed
        tag = h.name.encode()
        for ledger_id in list(self.world.state.ledgers):
            versioned = self.world.ledger(ledger_id)
            if versioned is None or versioned.value.custom_metadata.get("log") != tag:
                continue
            if ledger_id in listed:
                continue
            holders = [b.name for b in self.world.bookies if b.up and b.stored(ledger_id, 0)]
            if holders:
                self._violate(
                    "AllNonEmptyLedgersInLedgerList", h.name,
                    f"ledger {ledger_id} outside the list holds entry 0 on {holders}",
                )  # fmt: skip

    def _order(self, h: LogHistory) -> None:
        assert h.md is not None
        latest, latest_ledger = -1, None
        for ledger_id in h.md.ledger_ids:
            if ledger_id not in h.written:
                continue
            low, high = h.written[ledger_id]
            if low < latest:
                self._violate(
                    "EntryOrderMaintained", h.name,
                    f"ledger {ledger_id} holds a write sent before one in ledger "
                    f"{latest_ledger}, earlier in the list",
                )  # fmt: skip
            if high > latest:
                latest, latest_ledger = high, ledger_id

    def _mapped(self, h: LogHistory) -> None:
        assert h.md is not None
        md = h.md
        for offset, record in h.acked.items():
            if offset < md.start_offset:
                continue
            found = md.locate(offset)
            if found is None:
                self._violate(
                    "AllAckedLogRecordsReadable", h.name,
                    f"acknowledged offset {offset} is past the log's end ({md.end_offset})",
                )  # fmt: skip
            elif found != (record.ledger_id, record.entry_id):
                self._violate(
                    "LogOffsetsDenseAndStable", h.name,
                    f"offset {offset} was acknowledged in ledger {record.ledger_id} entry "
                    f"{record.entry_id}; the log maps it to ledger {found[0]} entry {found[1]}",
                )  # fmt: skip

    def verify_read_back(self, name: str, start: int, payloads: list[bytes]) -> None:
        """After the faults: the whole log read from ``start`` (offsets ``start``...)."""
        h = self.log(name)
        for offset, payload in enumerate(payloads, start):
            self.read(name, "verifier", offset, payload)
        end = start + len(payloads)
        for offset, record in sorted(h.acked.items()):
            if start <= offset and (offset >= end or payloads[offset - start] != record.payload):
                self._violate(
                    "AllAckedLogRecordsReadable", name,
                    f"acknowledged offset {offset} does not read back (log read {start}..{end})",
                )  # fmt: skip
                return


def _state(world: World, ledger_id: int) -> str:
    versioned = world.ledger(ledger_id)
    if versioned is None:
        return "deleted"
    return versioned.value.state.name if versioned.value.state is not LedgerState.OPEN else "OPEN"
