"""Choosing replacement bookies for a fragment, and committing them. Pure: no I/O.

Theory of operation
-------------------
A bookie that cannot hold its copies any more (lost, failing, decommissioned) is replaced in
each fragment it is in by a bookie the **placement policy** chooses, as at write time
(``client/placement.py``): never a member of the fragment's ensemble, never a bookie that is
itself unusable, and always one that spreads
the write sets through that index over the most racks available — a replacement that puts two
copies of a write set in one rack is taken only when no bookie avoids it (BP-31: placement
during re-replication). Ensemble members that are not registered get a rack of their own, so a
dead bookie never counts against a candidate.

A worker that crashed after copying and before committing left its choice in the mark's plan:
the same target is chosen again when it is still among the best, so its copies are not
wasted.

:func:`commit` is the compare-and-swap transform: it swaps the bookies only if the fragment
still has the ones that were replaced (or already the new ones), else the work is redone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping

from ..client.placement import Candidate, PlacementPolicy, rack_of
from ..errors import NotEnoughBookiesError
from ..metadata.model import LedgerMetadata, Versioned
from .copier import ReplicationError

Plan = Collection[tuple[int, int, str, str]]  # (first entry, index, old bookie, new bookie)


def choose(
    first: int,
    ensemble: tuple[str, ...],
    indexes: Collection[int],
    write_quorum: int,
    registered: Mapping[str, Candidate],
    unusable: Collection[str],
    policy: PlacementPolicy,
    rng: random.Random,
    plan: Plan = (),
) -> dict[int, str]:
    """Replacements for ``ensemble[i]``, ``i`` in ``indexes`` (see the module docstring).

    Raises:
        NotEnoughBookiesError: no eligible bookie (the message says where they went).
    """
    planned = {(f, i, old): new for f, i, old, new in plan}
    exclude = set(unusable)
    current = list(ensemble)
    chosen: dict[int, str] = {}
    for index in sorted(indexes):
        old = ensemble[index]
        pool = _eligible(registered, exclude | {old}, current)
        if not pool:
            raise NotEnoughBookiesError(
                f"no bookie to replace {old} in the segment at {first}: {len(registered)} "
                f"registered, {len(exclude)} unusable, {len(ensemble)} in the ensemble"
            )
        racks = [_rack(registered, b) for b in current]
        ranks = {c: rank(racks, index, write_quorum, rack_of(registered[c])) for c in pool}
        best = max(ranks.values()) if policy.rack_aware else None
        top = [c for c in pool if best is None or ranks[c] == best]
        again = planned.get((first, index, old))
        target = again if again in top else rng.choice(top)
        current[index] = target
        chosen[index] = target
    return chosen


def rank(racks: list[str], index: int, write_quorum: int, rack: str) -> tuple[int, int]:
    """How well ``rack`` at ``index`` spreads the write sets through it: (fewest distinct
    racks over them, their sum). A rack none of them has yet is best in both."""
    size = len(racks)
    trial = [*racks[:index], rack, *racks[index + 1 :]]
    spreads = [
        len({trial[(start + k) % size] for k in range(write_quorum)})
        for start in ((index - j) % size for j in range(min(write_quorum, size)))
    ]
    return min(spreads), sum(spreads)


def neighbour_racks(racks: list[str], index: int, write_quorum: int) -> set[str]:
    """Racks of the other members of every write set through ``index``."""
    size = len(racks)
    near = {(index + d) % size for d in range(-(write_quorum - 1), write_quorum)} - {index}
    return {racks[i] for i in near}


def _rack(registered: Mapping[str, Candidate], bookie: str) -> str:
    """A member's rack; one of its own when it is not registered (never counts against)."""
    found = registered.get(bookie)
    return rack_of(found) if found is not None else f"/unavailable/{bookie}"


def _eligible(
    registered: Mapping[str, Candidate], exclude: set[str], current: list[str]
) -> list[str]:
    members = set(current)
    return [
        b
        for b in sorted(registered)
        if not registered[b].read_only and b not in exclude and b not in members
    ]


def commit(
    first: int, replaced: Mapping[int, tuple[str, str]]
) -> Callable[[Versioned], LedgerMetadata | None]:
    """The CAS transform swapping ``{index: (old, new)}`` in the segment at ``first``."""

    def transform(v: Versioned) -> LedgerMetadata | None:
        md: LedgerMetadata = v.value
        segments = dict(md.ensembles)
        ensemble = segments.get(first)
        if ensemble is None:
            raise ReplicationError(f"ledger {md.ledger_id}: the segment at {first} is gone")
        changes = {}
        for index, (old, new) in replaced.items():
            if ensemble[index] == new:
                continue
            if ensemble[index] != old:
                raise ReplicationError(
                    f"ledger {md.ledger_id}: {old} at index {index} of the segment at {first} "
                    f"was replaced by {ensemble[index]} meanwhile"
                )
            changes[index] = new
        return md.with_replicas_replaced(first, changes) if changes else None

    return transform
