"""Choosing bookies for ensembles and replacements. Pure; deterministic for a given rng.

Theory of operation
-------------------
A :class:`PlacementPolicy` picks among the *eligible* candidates: registered, writable, not
excluded (and, for a replacement, not already in the ensemble). Every random choice comes
from the injected ``random.Random`` over candidates sorted by bookie id, so a seed replays
exactly. Candidates are anything with ``bookie_id``, ``rack`` and ``read_only`` — a
:class:`BookieCandidate` or the metadata store's ``BookieInfo``.

With ``min_racks_per_write_quorum`` R = 1 this is BookKeeper's
``DefaultEnsemblePlacementPolicy``: a uniform random choice. With R > 1 it is rack-aware
(``RackawareEnsemblePlacementPolicy``): every write set should span at least ``min(R, WQ)``
racks; a bookie without a rack is on ``/default-rack``.

* ``new_ensemble`` chooses a rack per position by a depth-first search that tries the most
  promising rack first (rare among the positions sharing a write set with it, then the rack
  with most bookies left, then random) and prunes as soon as a write set can no longer reach
  the target; the search is bounded by ``search_steps_max``. Bookies are then drawn at random
  within each rack.
* ``replace_bookie`` scores every candidate by the fewest racks over the write sets that
  contain the replaced index, and picks at random among the best.

When no choice reaches ``min(R, WQ)``, the policy settles for the best it finds — unless
``strict`` (BP-31 strict placement; BookKeeper's ``enforceMinNumRacksPerWriteQuorum``), which
raises :class:`NotEnoughBookiesError` instead and does not use bookies without a rack at all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError, NotEnoughBookiesError

DEFAULT_RACK = "/default-rack"


class Candidate(Protocol):
    """What placement needs to know about a registered bookie."""

    @property
    def bookie_id(self) -> str: ...
    @property
    def rack(self) -> str | None: ...
    @property
    def read_only(self) -> bool: ...


@dataclass(frozen=True)
class BookieCandidate:
    """A registered bookie as placement sees it (``rack`` None: ``/default-rack``)."""

    bookie_id: str
    rack: str | None = None
    read_only: bool = False


def rack_of(candidate: Candidate | None) -> str:
    """The candidate's rack; ``/default-rack`` if it has none or is unknown (None)."""
    return (candidate.rack if candidate is not None else None) or DEFAULT_RACK


def write_set_rack_spread(racks: Sequence[str | None], write_quorum: int) -> int:
    """The fewest distinct racks over the ensemble's write sets (``racks`` by index)."""
    size = len(racks)
    assert 1 <= write_quorum <= size, (write_quorum, size)
    return min(
        len({racks[(first + i) % size] or DEFAULT_RACK for i in range(write_quorum)})
        for first in range(size)
    )


@dataclass(frozen=True)
class PlacementPolicy:
    """See the module docstring.

    Raises:
        ConfigError: ``min_racks_per_write_quorum`` or ``search_steps_max`` below 1.
    """

    min_racks_per_write_quorum: int = 1
    strict: bool = False
    search_steps_max: int = 10_000

    def __post_init__(self) -> None:
        if self.min_racks_per_write_quorum < 1 or self.search_steps_max < 1:
            raise ConfigError(
                f"placement: min_racks_per_write_quorum={self.min_racks_per_write_quorum} "
                f"and search_steps_max={self.search_steps_max} must be at least 1"
            )

    @property
    def rack_aware(self) -> bool:
        return self.min_racks_per_write_quorum > 1

    def target_racks(self, write_quorum: int) -> int:
        """Racks each write set should span: ``min(R, WQ)``."""
        return min(self.min_racks_per_write_quorum, write_quorum)

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        candidates: Iterable[Candidate],
        rng: random.Random,
        exclude: Iterable[str] = (),
    ) -> tuple[str, ...]:
        """``ensemble_size`` distinct eligible bookies, in ensemble order.

        Raises:
            NotEnoughBookiesError: fewer eligible bookies than ``ensemble_size``, or (strict)
                no ensemble whose every write set spans ``min(R, WQ)`` racks.
        """
        assert 1 <= write_quorum <= ensemble_size, (write_quorum, ensemble_size)
        pool = self._eligible(candidates, exclude, (), ensemble_size)
        if not self.rack_aware:
            return tuple(c.bookie_id for c in rng.sample(pool, ensemble_size))
        groups = _by_rack(pool, rng)
        target = self.target_racks(write_quorum)
        for want in range(target, 0, -1):  # want == 1 always succeeds
            counts = {rack: len(group) for rack, group in groups.items()}
            racks = _rack_sequence(
                counts, ensemble_size, write_quorum, want, rng, self.search_steps_max
            )
            if racks is not None:
                return tuple(groups[rack].pop().bookie_id for rack in racks)
            self._check_strict(f"ensemble of {ensemble_size}", write_quorum, f"{len(groups)} racks")
        raise AssertionError("unreachable: any ensemble spans one rack")

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        candidates: Iterable[Candidate],
        rng: random.Random,
        exclude: Iterable[str] = (),
    ) -> str:
        """A bookie to take ``ensemble[index]``'s place; never a current member.

        Raises:
            NotEnoughBookiesError: no eligible bookie outside the ensemble, or (strict) none
                keeps every write set through ``index`` on ``min(R, WQ)`` racks.
        """
        assert 0 <= index < len(ensemble) and 1 <= write_quorum <= len(ensemble)
        known = {c.bookie_id: c for c in candidates}
        pool = self._eligible(known.values(), exclude, ensemble, 1)
        if not self.rack_aware:
            return rng.choice(pool).bookie_id
        racks = [rack_of(known.get(b)) for b in ensemble]
        scores = [_replacement_score(racks, index, write_quorum, rack_of(c)) for c in pool]
        top = max(scores)
        if top < self.target_racks(write_quorum):
            self._check_strict(f"replacement for {ensemble[index]}", write_quorum, f"best {top}")
        return rng.choice([c for c, s in zip(pool, scores, strict=True) if s == top]).bookie_id

    def _eligible(
        self,
        candidates: Iterable[Candidate],
        exclude: Iterable[str],
        ensemble: Sequence[str],
        needed: int,
    ) -> list[Candidate]:
        """Eligible candidates sorted by id; raise NotEnoughBookiesError if fewer than needed."""
        by_id = {c.bookie_id: c for c in candidates}
        ordered = [by_id[b] for b in sorted(by_id)]
        excluded, members = set(exclude), set(ensemble)
        writable = [c for c in ordered if not c.read_only and c.bookie_id not in members]
        pool = [c for c in writable if c.bookie_id not in excluded]
        without_rack = 0
        if self.strict and self.rack_aware:
            without_rack = sum(1 for c in pool if rack_of(c) == DEFAULT_RACK)
            pool = [c for c in pool if rack_of(c) != DEFAULT_RACK]
        if len(pool) < needed:
            raise NotEnoughBookiesError(
                _shortage(needed, len(pool), ordered, len(writable) - len(pool) - without_rack,
                          members, without_rack)
            )  # fmt: skip
        return pool

    def _check_strict(self, what: str, write_quorum: int, detail: str) -> None:
        """Called when ``what`` missed the rack target: raise if strict, else settle."""
        if self.strict:
            raise NotEnoughBookiesError(
                f"strict placement: no {what} puts every write set of {write_quorum} bookies "
                f"on {self.target_racks(write_quorum)} racks ({detail})"
            )


def _shortage(
    needed: int,
    eligible: int,
    ordered: list[Candidate],
    excluded: int,
    members: set[str],
    without_rack: int,
) -> str:
    """The NotEnoughBookiesError message: what was needed and where the candidates went."""
    read_only = sum(1 for c in ordered if c.read_only)
    where = "outside the ensemble " if members else ""
    noun = "bookie" if needed == 1 else "bookies"
    parts = [f"{len(ordered)} registered", f"{read_only} read-only", f"{excluded} excluded"]
    if members:
        parts.append(f"{len(members)} in the ensemble")
    if without_rack:
        parts.append(f"{without_rack} without a rack (strict placement)")
    return f"need {needed} writable {noun} {where}but {eligible} eligible: {', '.join(parts)}"


def _by_rack(pool: list[Candidate], rng: random.Random) -> dict[str, list[Candidate]]:
    """The pool grouped by rack (racks sorted), each group in random order."""
    groups: dict[str, list[Candidate]] = {}
    for c in rng.sample(pool, len(pool)):
        groups.setdefault(rack_of(c), []).append(c)
    return {rack: groups[rack] for rack in sorted(groups)}


def _rack_sequence(
    counts: dict[str, int], size: int, write_quorum: int, want: int, rng: random.Random,
    steps_max: int,
) -> list[str] | None:  # fmt: skip
    """Racks for positions ``0..size-1`` with every write set on ``want`` racks, or None.

    A depth-first search that tries the most promising rack first (rare among the positions
    sharing a write set, then most bookies left, then random) and gives up after
    ``steps_max`` steps. ``counts`` (bookies left per rack) is consumed.
    """
    sequence: list[str] = []
    steps = 0

    def extend() -> bool:
        nonlocal steps
        if len(sequence) == size:
            return True
        steps += 1
        if steps > steps_max:
            return False
        for rack in _rack_order(counts, sequence, size, write_quorum, rng):
            counts[rack] -= 1
            sequence.append(rack)
            if _can_reach(sequence, size, write_quorum, want) and extend():
                return True
            sequence.pop()
            counts[rack] += 1
        return False

    return sequence if extend() else None


def _rack_order(
    counts: dict[str, int], sequence: list[str], size: int, write_quorum: int,
    rng: random.Random,
) -> list[str]:  # fmt: skip
    """Racks with bookies left, the most promising for the next position first."""
    position = len(sequence)
    near = [r for q, r in enumerate(sequence) if _close(position, q, size, write_quorum)]
    keys = {r: (near.count(r), -left, rng.random()) for r, left in counts.items() if left}
    return sorted(keys, key=keys.__getitem__)


def _can_reach(sequence: list[str], size: int, write_quorum: int, want: int) -> bool:
    """Every write set through the last placed position can still span ``want`` racks."""
    last = len(sequence) - 1
    for first in (last - k for k in range(write_quorum)):
        members = [(first + i) % size for i in range(write_quorum)]
        placed = [sequence[m] for m in members if m <= last]
        if len(set(placed)) + write_quorum - len(placed) < want:
            return False
    return True


def _close(a: int, b: int, size: int, write_quorum: int) -> bool:
    """Positions ``a`` and ``b`` share a write set (cyclic distance below WQ)."""
    distance = abs(a - b)
    return min(distance, size - distance) < write_quorum


def _replacement_score(racks: list[str], index: int, write_quorum: int, rack: str) -> int:
    """Fewest distinct racks over the write sets containing ``index`` if it moves to ``rack``."""
    size = len(racks)
    trial = [*racks[:index], rack, *racks[index + 1 :]]
    return min(
        len({trial[(first + i) % size] for i in range(write_quorum)})
        for first in ((index - k) % size for k in range(write_quorum))
    )
