"""Cluster admin commands on the metadata store: init-cluster, list-bookies, list-ledgers,
ledger-metadata, cookie-fix. Each returns the text to print (JSON where a script may parse it)."""

from __future__ import annotations

import json

from ..bookie.cookie import request_cookie_fix
from ..metadata.store import open_metadata_store


async def init_cluster(uri: str) -> str:
    """Create the cluster's instance id (idempotent)."""
    async with open_metadata_store(uri) as store:
        existed = await store.get_instance_id()
        instance_id = await store.init_cluster()
    state = "already initialized" if existed else "initialized"
    return f"cluster {state}: instance id {instance_id}"


async def list_bookies(uri: str, read_only: bool = False, as_json: bool = False) -> str:
    """Registered bookies, one per line: id, rack, writable/read-only (``read_only``: only
    those; ``as_json``: a JSON object per line)."""
    async with open_metadata_store(uri) as store:
        bookies = {k: b for k, b in (await store.list_bookies()).items()
                   if b.read_only or not read_only}  # fmt: skip
    if as_json:
        return "\n".join(
            json.dumps(
                {
                    "bookie_id": b.bookie_id,
                    "address": b.address,
                    "rack": b.rack,
                    "read_only": b.read_only,
                }
            )
            for b in bookies.values()
        )
    lines = [
        f"{b.bookie_id}\t{b.rack or '-'}\t{'read-only' if b.read_only else 'writable'}"
        for b in bookies.values()
    ]
    none = "no read-only bookies" if read_only else "no bookies registered"
    return "\n".join(lines) if lines else none


async def list_ledgers(uri: str, as_json: bool = False) -> str:
    """Every ledger id, one per line (``as_json``: ``{"ledger_id": ID}`` per line)."""
    async with open_metadata_store(uri) as store:
        ids = [i async for i in store.list_ledgers()]
    if as_json:
        return "\n".join(json.dumps({"ledger_id": i}) for i in ids)
    return "\n".join(map(str, ids)) if ids else "no ledgers"


async def ledger_metadata(uri: str, ledger_id: int) -> str:
    """One ledger's metadata as indented JSON (with its version).

    Raises:
        NoSuchLedgerError: no such ledger.
    """
    async with open_metadata_store(uri) as store:
        versioned = await store.read_ledger(ledger_id)
    doc = json.loads(versioned.value.to_json_bytes())
    doc["version"] = versioned.version
    return json.dumps(doc, indent=2, sort_keys=True)


async def cookie_fix(uri: str, bookie_id: str) -> str:
    """Approve, once, the BP-46 repair of a bookie whose dirs lost their cookies: on its next
    start it fences and limbos its open ledgers, restamps its cookies and repairs from peers.

    Raises:
        CookieError: the store has no cookie for this bookie.
    """
    async with open_metadata_store(uri) as store:
        return await request_cookie_fix(store, bookie_id)
