"""Cluster admin commands on the metadata store: init-cluster, list-bookies, list-ledgers,
ledger-metadata, cookie-fix, delete-ledger, mark-archived, cluster-config, list-tombstones.
Each returns the text to print (JSON where a script may parse it)."""

from __future__ import annotations

import json

from ..bookie.cookie import request_cookie_fix
from ..client import deletion
from ..errors import IncorrectParameterError
from ..metadata import tombstones
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


async def delete_ledger(uri: str, ledger_id: int) -> str:
    """Delete a ledger through the client's one delete path (tombstone, then bookies' GC).

    Raises:
        NoSuchLedgerError, LedgerOfLogError, LedgerNotArchivedError (see BookKeeper).
    """
    from ..client.bookkeeper import BookKeeper

    async with BookKeeper.connect(uri) as bk:
        await bk.delete_ledger(ledger_id)
    return f"ledger {ledger_id} deleted: tombstoned; bookies free its space at their next GC"


async def mark_archived(uri: str, ledger_id: int) -> str:
    """Set a closed ledger's archival bit.

    Raises:
        NoSuchLedgerError, IncorrectParameterError (not closed).
    """
    async with open_metadata_store(uri) as store:
        await deletion.mark_archived(store, ledger_id)
    return f"ledger {ledger_id} archived"


async def cluster_config(uri: str, name: str | None, value: str | None) -> str:
    """Show the cluster's options (JSON), or set one (``true``/``false``).

    Raises:
        IncorrectParameterError: an unknown option or a value other than true/false.
    """
    async with open_metadata_store(uri) as store:
        if name is None:
            options = await tombstones.read_cluster_options(store)
        else:
            if value not in ("true", "false"):
                raise IncorrectParameterError(f"{name}: the value must be true or false")
            option = name.replace("-", "_")
            if option not in tombstones.CLUSTER_OPTIONS:
                known = ", ".join(o.replace("_", "-") for o in tombstones.CLUSTER_OPTIONS)
                raise IncorrectParameterError(f"unknown cluster option {name!r}; known: {known}")
            options = await tombstones.set_cluster_option(store, option, value == "true")
    doc = json.loads(options.to_json_bytes())
    return json.dumps({k.replace("_", "-"): v for k, v in doc.items()}, indent=2, sort_keys=True)


async def list_tombstones(uri: str, as_json: bool) -> str:
    """Deleted ledgers whose bookies have not all confirmed: id, age, confirmations."""
    async with open_metadata_store(uri) as store:
        stones = [v.value async for v in tombstones.list_tombstones(store)]
    if as_json:
        return "\n".join(json.dumps(json.loads(t.to_json_bytes()), sort_keys=True) for t in stones)
    lines = [
        f"{t.ledger_id}\tdeleted_ms={t.deleted_ms}\tconfirmed {len(t.confirmed)}/"
        f"{len(t.bookies)}\twaiting for {','.join(sorted(set(t.bookies) - set(t.confirmed)))}"
        for t in stones
    ]
    return "\n".join(lines) if lines else "no tombstones"
