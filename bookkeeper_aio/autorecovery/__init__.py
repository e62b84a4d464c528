"""Autorecovery (BP-31 durability contract): WQ copies of every entry, all the time.

An auditor (one at a time, elected through the metadata store) marks under-replicated ledgers;
replication workers (every autorecovery process) restore their copies. See
``docs/durability.md``; modules: ``state`` (keys), ``fragments`` (which entries a bookie must
hold), ``checker`` (the replicas check), ``audit`` (a pass over every ledger), ``auditor``,
``election``, ``copier``, ``replacement``, ``worker``, ``service`` (a whole process),
``decommission``.
"""

from .service import Autorecovery

__all__ = ["Autorecovery"]
