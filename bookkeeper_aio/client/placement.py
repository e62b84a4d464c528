"""Choosing bookies for ensembles and replacements. Pure, deterministic for a given rng.

Theory of operation
-------------------
:class:`PlacementPolicy` picks among *writable* registered bookies, never an excluded one, with
all randomness from an injected ``random.Random`` over sorted candidates (so a seed replays).
With ``min_racks_per_write_quorum > 1`` it is rack-aware (BookKeeper's
``RackawareEnsemblePlacementPolicy``): it tries ensembles until every write set spans that many
racks (a bounded number of attempts). If none is found it falls back to the best one it saw,
unless ``strict`` (BP-31 strict placement), in which case it raises
:class:`NotEnoughBookiesError` rather than put a write set into too few fault domains.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import NotEnoughBookiesError
from ..metadata.store import BookieInfo
from ..quorum import write_set

DEFAULT_RACK = "/default-rack"


@dataclass(frozen=True)
class PlacementPolicy:
    """See the module docstring."""

    min_racks_per_write_quorum: int = 1
    strict: bool = False
    attempts_max: int = 100

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Iterable[BookieInfo],
        rng: random.Random,
        exclude: Iterable[str] = (),
    ) -> tuple[str, ...]:
        """``ensemble_size`` distinct writable bookies.

        Raises:
            NotEnoughBookiesError: too few candidates (or, if strict, no rack-diverse choice).
        """
        pool = _candidates(bookies, exclude)
        if len(pool) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, have {len(pool)} "
                f"(excluded {len(set(exclude))})"
            )
        best: tuple[int, tuple[BookieInfo, ...]] | None = None
        for _ in range(self.attempts_max if self.min_racks_per_write_quorum > 1 else 1):
            ensemble = tuple(rng.sample(pool, ensemble_size))
            score = _rack_score(ensemble, write_quorum)
            if best is None or score > best[0]:
                best = (score, ensemble)
            if score >= self.min_racks_per_write_quorum:
                break
        assert best is not None
        self._check_strict(best[0])
        return tuple(b.bookie_id for b in best[1])

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Iterable[BookieInfo],
        rng: random.Random,
        exclude: Iterable[str] = (),
    ) -> str:
        """A bookie to take ``ensemble[index]``'s place; never a current member.

        Raises:
            NotEnoughBookiesError: no writable bookie outside the ensemble and exclusions.
        """
        infos = {b.bookie_id: b for b in bookies}
        pool = _candidates(infos.values(), [*exclude, *ensemble])
        if not pool:
            raise NotEnoughBookiesError(
                f"no writable bookie left to replace {ensemble[index]} "
                f"({len(infos)} registered, ensemble of {len(ensemble)})"
            )
        rng.shuffle(pool)
        best: tuple[int, BookieInfo] | None = None
        for candidate in pool:
            trial = [infos.get(b) or BookieInfo(b, b, None, False) for b in ensemble]
            trial[index] = candidate
            score = _rack_score(tuple(trial), write_quorum)
            if best is None or score > best[0]:
                best = (score, candidate)
            if score >= self.min_racks_per_write_quorum:
                break
        assert best is not None
        self._check_strict(best[0])
        return best[1].bookie_id

    def _check_strict(self, score: int) -> None:
        if self.strict and score < self.min_racks_per_write_quorum:
            raise NotEnoughBookiesError(
                f"strict placement: no choice spans {self.min_racks_per_write_quorum} racks "
                f"in every write set (best spans {score})"
            )


def _candidates(bookies: Iterable[BookieInfo], exclude: Iterable[str]) -> list[BookieInfo]:
    excluded = set(exclude)
    return sorted(
        (b for b in bookies if not b.read_only and b.bookie_id not in excluded),
        key=lambda b: b.bookie_id,
    )


def _rack_score(ensemble: tuple[BookieInfo, ...], write_quorum: int) -> int:
    """The fewest distinct racks over the ensemble's write sets."""
    size = len(ensemble)
    return min(
        len({ensemble[i].rack or DEFAULT_RACK for i in write_set(first, size, write_quorum)})
        for first in range(size)
    )
