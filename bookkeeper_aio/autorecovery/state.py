"""Autorecovery's own keys in the metadata store: the auditor's seat, lost bookies, bookie
incarnations, decommissions, and each process's published statistics.

Theory of operation
-------------------
Everything an auditor decides must survive its death, so the next auditor carries on:

* ``autorecovery/auditor`` — the seat: ``{"auditor": ID, "since_ms": T}`` under the auditor's
  lease, created only if absent (election.py);
* ``autorecovery/lost/<bookie>`` — a bookie declared lost (gone for the delay, or an old
  incarnation): workers replace it wherever it still holds a fragment;
* ``autorecovery/incarnations/<bookie>`` — the last incarnation id the auditor saw register;
* ``autorecovery/decommission/<bookie>`` — an operator is moving everything off the bookie;
* ``autorecovery/processes/<id>`` — a process's counters (copies, bytes, marks), under its
  lease, so the auditor and the shell can add them up (the SLA figures).

Values are small JSON documents; the ``*_ms`` fields are wall-clock times for people.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import MetadataFormatError
from ..metadata.lease import Lease
from ..metadata.store import MetadataStore

AUDITOR_KEY = "autorecovery/auditor"
LOST_PREFIX = "autorecovery/lost/"
INCARNATIONS_PREFIX = "autorecovery/incarnations/"
DECOMMISSION_PREFIX = "autorecovery/decommission/"
PROCESSES_PREFIX = "autorecovery/processes/"
AUDITOR_STATS_KEY = "autorecovery/auditor-statistics"


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def decode(key: str, data: bytes) -> dict[str, Any]:
    """Raises MetadataFormatError for a value that is not a JSON object."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise MetadataFormatError(f"{key}: not JSON: {data[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise MetadataFormatError(f"{key}: not a JSON object: {data[:200]!r}")
    return doc


async def read_prefix(store: MetadataStore, prefix: str) -> dict[str, dict[str, Any]]:
    """``{last key segment: document}`` of every key under ``prefix``."""
    found = {}
    async for key, versioned in store.list_prefix(prefix):
        found[key[len(prefix) :]] = decode(key, versioned.value)
    return found


async def lost_bookies(store: MetadataStore) -> dict[str, dict[str, Any]]:
    """Bookies declared lost: ``{bookie: {"since_ms", "reason", "incarnation"}}``."""
    return await read_prefix(store, LOST_PREFIX)


async def decommissioning(store: MetadataStore) -> dict[str, dict[str, Any]]:
    """Bookies being decommissioned: ``{bookie: {"since_ms"}}``."""
    return await read_prefix(store, DECOMMISSION_PREFIX)


async def declare_lost(
    store: MetadataStore, bookie: str, reason: str, incarnation: str, now_ms: int
) -> None:
    doc = {"since_ms": now_ms, "reason": reason, "incarnation": incarnation}
    await store.put(LOST_PREFIX + bookie, encode(doc))


async def forget_lost(store: MetadataStore, bookie: str) -> None:
    await store.delete(LOST_PREFIX + bookie)


async def publish_process(
    store: MetadataStore, process_id: str, stats: dict[str, Any], lease: Lease
) -> None:
    """Publish a process's counters under its lease (they vanish with it)."""
    await store.put(PROCESSES_PREFIX + process_id, encode(stats), lease=lease)


async def process_statistics(store: MetadataStore) -> dict[str, dict[str, Any]]:
    return await read_prefix(store, PROCESSES_PREFIX)
