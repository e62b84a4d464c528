"""A deterministic simulation of a whole cluster: bookies, clients and metadata on one
virtual-time event loop, with faults from one seeded rng (see ``docs/simulation.md``).

Nothing outside this package imports it; it runs the real bookie and client code through
their seams (network, storage, metadata, clock).
"""
