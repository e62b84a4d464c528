"""Under-replication marks: which ledger lacks which copies, why, since when; and their locks.

Theory of operation
-------------------
BP-31's contract is WQ copies of every entry, all the time. Whoever sees a ledger fall short
— the auditor (a lost bookie, a periodic check), a writer (a bookie failed after the entry
reached AQ), a reader (an error or a bad digest from a replica), a bookie (a failed ledger
dir, an entry its integrity check could not repair), an operator (decommission) — writes a
**mark**: one readable JSON key per ledger, ``underreplicated/ledgers/<ledger id>``, listing
per bookie what it lacks (entry ranges, or every entry it should hold) and why. Marks merge:
a second mark of the same ledger adds to the first by compare-and-swap, so no report is lost.

Replication workers take a mark by creating ``underreplicated/locks/<ledger id>`` (create
only) under their own lease: a dead worker's lock goes with its lease, and the mark is taken
again. A worker that restored every copy deletes the mark *at the version it read*: a report
merged meanwhile keeps the mark for another round.

This module is the pure model (:class:`Mark`, :class:`Missing`, merging, JSON) and the store
functions; it imports nothing above the metadata store, so the client and the bookie can mark
ledgers. ``since_ms`` are wall-clock timestamps for people (``list-under-replicated``); no
decision is taken on them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import MetadataFormatError, MetadataVersionError
from .lease import Lease
from .model import Versioned
from .store import MetadataStore

MARKS_PREFIX = "underreplicated/ledgers/"
LOCKS_PREFIX = "underreplicated/locks/"
RANGES_MAX = 256  # per bookie; past it the mark says "every entry" (the worker lists them)
ERROR_CHARS_MAX = 500
CAS_ATTEMPTS_MAX = 50
ALL: tuple[tuple[int, int], ...] = ()  # Missing.entries: every entry the bookie should hold


def mark_key(ledger_id: int) -> str:
    return f"{MARKS_PREFIX}{ledger_id:020d}"


def lock_key(ledger_id: int) -> str:
    return f"{LOCKS_PREFIX}{ledger_id:020d}"


def to_ranges(entry_ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Entry ids as sorted inclusive ``(first, last)`` runs: {1,2,3,7} -> ((1,3),(7,7))."""
    ranges: list[list[int]] = []
    for i in sorted(set(entry_ids)):
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return tuple((a, b) for a, b in ranges)


def merge_ranges(*parts: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The union of inclusive ranges, as sorted disjoint runs."""
    merged: list[list[int]] = []
    for a, b in sorted(r for part in parts for r in part):
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)


@dataclass(frozen=True)
class Missing:
    """Copies one bookie lacks: ``entries`` as inclusive ranges, or :data:`ALL` (every entry
    of the ledger its write sets give it), and why (short words: ``lost``, ``decommission``,
    ``periodic check``, ``read error``, ...)."""

    bookie: str
    reasons: tuple[str, ...]
    since_ms: int
    entries: tuple[tuple[int, int], ...] = ALL

    def merged(self, other: Missing) -> Missing:
        assert other.bookie == self.bookie
        if not self.entries or not other.entries:
            entries = ALL
        else:
            entries = merge_ranges(self.entries, other.entries)
            if len(entries) > RANGES_MAX:
                entries = ALL
        return Missing(
            self.bookie,
            tuple(sorted(set(self.reasons) | set(other.reasons))),
            min(self.since_ms, other.since_ms),
            entries,
        )

    def entry_count(self) -> int | None:
        """How many entries are named (None: every entry)."""
        return sum(b - a + 1 for a, b in self.entries) if self.entries else None


@dataclass(frozen=True)
class Mark:
    """One under-replicated ledger (see the module docstring). ``plan`` records the
    replacements a worker chose, ``[first_entry_id, index, old bookie, new bookie]``, so that
    a worker taking the mark over after a crash copies to the same bookies and skips what is
    there already; ``attempts`` and ``last_error`` tell an operator what goes wrong."""

    ledger_id: int
    missing: tuple[Missing, ...]
    since_ms: int
    attempts: int = 0
    last_error: str = ""
    plan: tuple[tuple[int, int, str, str], ...] = field(default_factory=tuple)

    def merged(self, missing: Iterable[Missing]) -> Mark:
        """This mark with more missing copies added (per bookie, merged)."""
        by_bookie = {m.bookie: m for m in self.missing}
        for m in missing:
            old = by_bookie.get(m.bookie)
            by_bookie[m.bookie] = m if old is None else old.merged(m)
        ordered = tuple(by_bookie[b] for b in sorted(by_bookie))
        since = min([self.since_ms, *(m.since_ms for m in ordered)])
        return dataclasses.replace(self, missing=ordered, since_ms=since)

    def failed(self, error: str) -> Mark:
        return dataclasses.replace(
            self, attempts=self.attempts + 1, last_error=error[:ERROR_CHARS_MAX]
        )

    def with_plan(self, plan: Iterable[tuple[int, int, str, str]]) -> Mark:
        return dataclasses.replace(self, plan=tuple(sorted(set(self.plan) | set(plan))))

    def bookies(self) -> list[str]:
        return [m.bookie for m in self.missing]

    def names(self, bookie: str) -> bool:
        return any(m.bookie == bookie for m in self.missing)

    def reasons(self) -> list[str]:
        return sorted({r for m in self.missing for r in m.reasons})

    def to_json_bytes(self) -> bytes:
        doc = {
            "ledger_id": self.ledger_id,
            "since_ms": self.since_ms,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "plan": [list(p) for p in self.plan],
            "missing": [
                {
                    "bookie": m.bookie,
                    "reasons": list(m.reasons),
                    "since_ms": m.since_ms,
                    "entries": [list(r) for r in m.entries] if m.entries else "all",
                }
                for m in self.missing
            ],
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Mark:
        """Raises MetadataFormatError for anything but a mark's JSON."""
        try:
            doc = json.loads(data)
            missing = tuple(_missing_from(m) for m in doc["missing"])
            plan = tuple((int(f), int(i), str(o), str(n)) for f, i, o, n in doc.get("plan", []))
            attempts, error = int(doc.get("attempts", 0)), str(doc.get("last_error", ""))
            return cls(int(doc["ledger_id"]), missing, int(doc["since_ms"]), attempts, error, plan)
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataFormatError(
                f"invalid under-replication mark {data[:200]!r}: {exc}"
            ) from exc


def _missing_from(doc: dict[str, Any]) -> Missing:
    entries = doc["entries"]
    ranges = ALL if entries == "all" else tuple((int(a), int(b)) for a, b in entries)
    return Missing(
        str(doc["bookie"]), tuple(map(str, doc["reasons"])), int(doc["since_ms"]), ranges
    )


# --- the store functions ---------------------------------------------------------------------


async def mark_under_replicated(
    store: MetadataStore, ledger_id: int, missing: Iterable[Missing], *, now_ms: int
) -> Mark:
    """Add ``missing`` to the ledger's mark (creating it), by compare-and-swap; return it.

    Raises:
        MetadataUnavailableError: the store cannot be reached.
        MetadataVersionError: still conflicting after many attempts (marks change rarely).
    """
    missing = list(missing)
    assert missing, "a mark names at least one bookie"
    for _ in range(CAS_ATTEMPTS_MAX):
        current = await store.get(mark_key(ledger_id))
        if current is None:
            mark = Mark(ledger_id, (), now_ms).merged(missing)
            version = 0
        else:
            old = Mark.from_json_bytes(current.value)
            mark, version = old.merged(missing), current.version
            if mark == old:
                return mark  # already known: no write
        try:
            await store.put(mark_key(ledger_id), mark.to_json_bytes(), expected_version=version)
            return mark
        except MetadataVersionError:
            continue
    raise MetadataVersionError(f"mark of ledger {ledger_id}: too many concurrent updates")


async def read_mark(store: MetadataStore, ledger_id: int) -> Versioned[Mark] | None:
    found = await store.get(mark_key(ledger_id))
    return None if found is None else Versioned(Mark.from_json_bytes(found.value), found.version)


async def list_marks(store: MetadataStore) -> AsyncIterator[Versioned[Mark]]:
    """Every mark in ledger-id order."""
    async for _key, found in store.list_prefix(MARKS_PREFIX):
        yield Versioned(Mark.from_json_bytes(found.value), found.version)


async def update_mark(
    store: MetadataStore, ledger_id: int, version: int, mark: Mark
) -> Versioned[Mark] | None:
    """Replace the mark at ``version`` (a worker's plan or failure); None if it moved or went."""
    try:
        done = await store.put(mark_key(ledger_id), mark.to_json_bytes(), expected_version=version)
    except MetadataVersionError:
        return None
    return Versioned(mark, done.version)


async def mark_done(store: MetadataStore, ledger_id: int, version: int) -> bool:
    """Delete the mark if still at ``version`` (every copy it named is restored). False when a
    report was merged meanwhile: the mark stays for another round."""
    try:
        await store.delete(mark_key(ledger_id), expected_version=version)
        return True
    except MetadataVersionError as exc:
        return exc.current is None  # gone already: done by someone else


async def claim(
    store: MetadataStore, ledger_id: int, worker_id: str, lease: Lease, *, now_ms: int
) -> int | None:
    """Lock the ledger's mark for ``worker_id`` under ``lease``; the lock's version, or None
    when another worker holds it. A lock already under this very lease is ours (an earlier
    claim whose reply was lost) and is taken as it is."""
    doc = {"worker": worker_id, "since_ms": now_ms, "lease": lease.lease_id}
    value = json.dumps(doc, sort_keys=True).encode()
    try:
        done = await store.put(lock_key(ledger_id), value, expected_version=0, lease=lease)
    except MetadataVersionError as exc:
        held = exc.current
        if isinstance(held, Versioned) and _lease_of(held.value) == lease.lease_id:
            return held.version
        return None
    return done.version


def _lease_of(value: bytes) -> int | None:
    try:
        return int(json.loads(value)["lease"])
    except (ValueError, KeyError, TypeError):
        return None


async def release(store: MetadataStore, ledger_id: int, lock_version: int) -> None:
    """Delete our lock (a lock that expired or was replaced meanwhile is left alone)."""
    try:
        await store.delete(lock_key(ledger_id), expected_version=lock_version)
    except MetadataVersionError:
        pass


async def lock_holder(store: MetadataStore, ledger_id: int) -> str | None:
    """Which worker holds the mark's lock, if any."""
    found = await store.get(lock_key(ledger_id))
    if found is None:
        return None
    try:
        return str(json.loads(found.value)["worker"])
    except (ValueError, KeyError, TypeError):
        return "?"
