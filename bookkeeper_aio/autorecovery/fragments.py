"""Which entries each bookie of a ledger must hold, as ranges. Pure: no I/O, no clock.

Theory of operation
-------------------
A segment (fragment) ``[first, end]`` of a ledger has an ensemble of E bookies; entry ``e``
lives on the write set ``(e + k) % E, k < WQ``, so ensemble index ``i`` holds the entries with
``(i - e) % E < WQ``: one run of WQ consecutive entries in every E (the whole segment when
E == WQ). A fragment's end is known when the ledger is CLOSED (its last entry) or when a later
segment starts; the last segment of an open ledger is **open**: its end is the writer's, and
autorecovery leaves it to the writer until the grace period is over (worker.py).

Everything here works on inclusive ``(first, last)`` ranges, so a ledger of millions of entries
costs a few thousand runs, not a set of millions of ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..metadata.model import LedgerMetadata

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Fragment:
    """A segment with its end: ``last`` is None for the open last segment of an open ledger;
    ``position`` is its index among the ledger's segments."""

    position: int
    first: int
    last: int | None
    ensemble: tuple[str, ...]

    @property
    def closed(self) -> bool:
        return self.last is not None

    @property
    def empty(self) -> bool:
        return self.last is not None and self.last < self.first


def fragments(md: LedgerMetadata) -> list[Fragment]:
    """Every segment of ``md`` with its end (see the module docstring)."""
    found = []
    for position, (first, ensemble) in enumerate(md.ensembles):
        if position + 1 < len(md.ensembles):
            last: int | None = md.ensembles[position + 1][0] - 1
        elif md.is_closed:
            last = md.last_entry_id
        else:
            last = None
        found.append(Fragment(position, first, last, ensemble))
    return found


def index_runs(
    index: int, first: int, last: int, ensemble_size: int, write_quorum: int
) -> Iterator[tuple[int, int]]:
    """The runs of ``[first, last]`` that ensemble index ``index`` must hold, in order."""
    if last < first:
        return
    if write_quorum >= ensemble_size:
        yield first, last
        return
    # Runs are [i - WQ + 1 + nE, i + nE]; start with the period that may overlap ``first``.
    n = (first - index) // ensemble_size
    while True:
        a = index - write_quorum + 1 + n * ensemble_size
        b = index + n * ensemble_size
        if a > last:
            return
        if b >= first:
            yield max(a, first), min(b, last)
        n += 1


def expected(md: LedgerMetadata, bookie: str, *, closed_only: bool = True) -> Ranges:
    """Every entry ``bookie`` must hold, over the fragments it is in (closed ones only, unless
    ``closed_only`` is False; an open fragment then counts up to nothing)."""
    runs: list[tuple[int, int]] = []
    for f in fragments(md):
        if bookie not in f.ensemble or f.last is None:
            continue
        index = f.ensemble.index(bookie)
        runs.extend(index_runs(index, f.first, f.last, md.ensemble_size, md.write_quorum))
    return normalize(runs)


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, disjoint, adjacent runs merged."""
    merged: list[list[int]] = []
    for a, b in sorted(ranges):
        if b < a:
            continue
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)


def subtract(have: Ranges, minus: Ranges) -> Ranges:
    """``have`` without ``minus`` (both normalized)."""
    out: list[tuple[int, int]] = []
    j = 0
    for a, b in have:
        start = a
        while j < len(minus) and minus[j][1] < start:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] <= b:
            ma, mb = minus[k]
            if ma > start:
                out.append((start, ma - 1))
            start = max(start, mb + 1)
            if start > b:
                break
            k += 1
        if start <= b:
            out.append((start, b))
    return tuple(out)


def intersect(a_ranges: Ranges, b_ranges: Ranges) -> Ranges:
    """Entries in both (both normalized)."""
    out, i, j = [], 0, 0
    while i < len(a_ranges) and j < len(b_ranges):
        a = max(a_ranges[i][0], b_ranges[j][0])
        b = min(a_ranges[i][1], b_ranges[j][1])
        if a <= b:
            out.append((a, b))
        if a_ranges[i][1] < b_ranges[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def count(ranges: Ranges) -> int:
    return sum(b - a + 1 for a, b in ranges)


def entries(ranges: Ranges) -> Iterator[int]:
    for a, b in ranges:
        yield from range(a, b + 1)


def replicas(md: LedgerMetadata, fragment: Fragment, entry_id: int) -> list[str]:
    """The bookies of ``fragment`` holding ``entry_id``, in write-set order."""
    size = md.ensemble_size
    return [fragment.ensemble[(entry_id + k) % size] for k in range(md.write_quorum)]


def by_preference(fragment: Fragment, holders: list[str], turn: int) -> list[str]:
    """``holders`` (bookies of ``fragment``) in one fixed order for every entry: the
    ensemble's, turned by ``turn``. A copier that reads each entry from the first of them
    reads every entry of a stored batch from the same bookie, where the write-set order
    (which turns with the entry id) would have several bookies each read the batch."""
    size = len(fragment.ensemble)
    rank = {b: (i - turn) % size for i, b in enumerate(fragment.ensemble)}
    return sorted(holders, key=rank.__getitem__)
