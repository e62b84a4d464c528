"""Guaranteed write quorum in the simulation: which ledgers use it, and its bug switches.

Half the ledgers whose write quorum exceeds their ack quorum are created with
``guaranteed_write_quorum=True`` (with WQ == AQ the option changes nothing). The coin has its
own generator, seeded from the run's seed, so drawing it moves no other random choice of the
scenario. Its invariant is :class:`~bookkeeper_aio.sim.checkers.ClosedLedgerEntriesAtWriteQuorum`.

Bug switches (client/writer.py):

* ``gwq-no-pinning``: an ensemble change may replace a bookie holding an acknowledged entry
  below WQ (the seed's figure 3: the entry can end up on fewer than AQ bookies of its
  ensemble, or on none).
* ``gwq-close-before-wq``: close() waits for acknowledgements only, as without the option,
  and closes with the last entries below WQ.
"""

from __future__ import annotations

import random

GWQ_BUGS = ("gwq-no-pinning", "gwq-close-before-wq")
GWQ_SHARE = 0.5  # of the ledgers with WQ > AQ


class GwqCoin:
    """Decides, ledger by ledger, whether it is created with guaranteed write quorum."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed * 1_000_003 + 29)

    def __call__(self, write_quorum: int, ack_quorum: int) -> bool:
        return write_quorum > ack_quorum and self._rng.random() < GWQ_SHARE
