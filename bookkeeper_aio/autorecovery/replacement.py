"""Choosing replacement bookies for a fragment, and committing them. Pure: no I/O.

Theory of operation
-------------------
A bookie that cannot hold its copies any more (lost, failing, decommissioned) is replaced in
each fragment it is in by a bookie the **placement policy** chooses, as at write time
(``client/placement.py``): never a member of the fragment's ensemble, never a bookie that is
itself unusable, and, rack-aware (``min_racks_per_write_quorum`` > 1), always one that spreads
the write sets through that index over the most racks available — a replacement that puts two
copies of a write set in one rack is taken only when no bookie avoids it (BP-31: placement
during re-replication). Ensemble members that are not registered get a rack of their own, so a
dead bookie never counts against a candidate.

A worker that crashed after copying and before committing left its choice in the mark's plan:
the same target is chosen again when it is still eligible, so its copies are not wasted.

:func:`commit` is the compare-and-swap transform: it swaps the bookies only if the fragment
still has the ones that were replaced (or already the new ones), else the work is redone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping

from ..client.placement import BookieCandidate, Candidate, PlacementPolicy
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
    candidates: dict[str, Candidate] = dict(registered)
    for bookie in ensemble:  # unregistered members: a rack of their own, never chosen
        if bookie not in registered:
            candidates[bookie] = BookieCandidate(bookie, f"/unavailable/{bookie}", read_only=True)
    exclude = set(unusable)
    current = list(ensemble)
    chosen: dict[int, str] = {}
    for index in sorted(indexes):
        old = ensemble[index]
        again = planned.get((first, index, old))
        if again is not None and _eligible(again, registered, exclude, current):
            target = again
        else:
            target = policy.replace_bookie(
                current, index, write_quorum, candidates.values(), rng, exclude | {old}
            )
        current[index] = target
        chosen[index] = target
    return chosen


def _eligible(
    bookie: str, registered: Mapping[str, Candidate], exclude: set[str], current: list[str]
) -> bool:
    found = registered.get(bookie)
    return found is not None and not found.read_only and bookie not in exclude | set(current)


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
