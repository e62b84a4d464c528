"""Chaos: writers, a recovering reader and random process faults against a real cluster.

``python -m bookkeeper_aio.chaos --duration 600 --seed 7`` (``make chaos``) starts etcd and 5
bookie processes on 127.0.0.1; ``tests/test_chaos.py`` runs a short round of the same code.

Theory of operation
-------------------
Several **writers** (one client each) append to a sequence of ledgers, alternating E3/WQ3/AQ2
and E3/WQ2/AQ2, a window of adds in flight, at a bounded rate. A payload is a pure function of
(seed, writer, ledger, entry id) -- header plus hash-derived filler of 0-1020 bytes -- so the
test keeps no copies: it records how far each ledger was *sent* and *acknowledged*. Adds
complete in entry order, so the acknowledged entries are always the prefix 0..acked_max; each
acknowledgement is checked to be the next entry id. A writer moves to a new ledger after a
random number of entries (closing the old one), or at once when its ledger is fenced or closed
under it.

A **recovering reader** (its own client) wakes every few seconds and picks a random live
ledger: usually it opens it with ``recovery=True`` (fencing the writer, which must then fail
with LedgerFencedError/LedgerClosedError and move on), sometimes without recovery, reading up
to the LAC. Whatever it reads must be byte-for-byte a payload the writer sent under that entry
id; a recovery must close the ledger at or past every entry acknowledged before it started,
and a LAC a reader saw must never be truncated later.

A **fault loop** draws actions from a ``random.Random(seed)``: kill -9 a bookie and restart it
a few seconds later, freeze one with SIGSTOP for 1-4 s (SIGCONT always follows, in a
``finally``), or restart one cleanly (SIGTERM). Some 40% of kills and freezes are *targeted*:
the victim is in a live ledger's current ensemble and that ledger is recovered 50 ms later, as
when a bookie and the writer's host fail together. At most ``max_unavailable`` (2 of 5)
bookies are dead or frozen at any moment, so an E3 ensemble can always be formed.

At the deadline the faults stop and the cluster is **healed** (every bookie thawed, dead ones
restarted), the writers close their ledgers, and a fresh client **verifies** every ledger:
it opens it with recovery (retrying while recovery cannot decide), requires it CLOSED, at the
entry any earlier close or recovery reported and at or past every acknowledged entry, and
reads it back in full: every acknowledged entry must be present with its exact payload, and
every entry present must be one the writer sent. Every wait has a timeout; a wait that runs
out is reported as an error (a liveness failure), never silently skipped. So is a bookie that
exits on its own (it is restarted), and a client call that raises CancelledError though
nothing cancelled its caller.

Determinism: the seed fixes the test's random choices (ledger sizes, fault kinds, victims,
delays, which ledger the reader picks) and the clients' rng (placement), not the ledger ids
(the metadata store draws them) nor the interleaving, which depends on timing.

The package: ``base`` (limits, the report, payloads), ``workload`` (writers and the reader),
``faults`` (the fault loop and healing), ``verify`` (the final check), ``run`` (one run and the
command line); the last three are parts of one ``_Chaos`` object.
"""

from __future__ import annotations

from .base import ChaosReport, payload, thawed_on_exit
from .run import main, run_chaos

__all__ = ["ChaosReport", "main", "payload", "run_chaos", "thawed_on_exit"]
