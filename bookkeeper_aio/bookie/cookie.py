"""Cookies: a bookie's identity, stamped on its dirs and in the metadata store.

Theory of operation
-------------------
A cookie says "these dirs belong to bookie B of cluster I" (BookKeeper's ``Cookie``). On first
boot (no cookie anywhere) the bookie writes it to the metadata store (create-if-absent) and
into a ``COOKIE`` file in its journal dir and every ledger dir. On every later boot all of them
must exist and agree. Each mismatch means data may be missing or misplaced, and a bookie that
silently serves an empty disk can make recovery truncate acknowledged entries, so the bookie
refuses to start with a message that says what is wrong and how to fix it:

* the cluster has no instance id → run ``shell init-cluster``;
* a dir's cookie is missing while others exist → the disk was replaced or wiped;
* a cookie names another cluster's instance id → the dirs belong to another cluster;
* the dir set changed (a dir added or removed) → the cookie lists the expected dirs.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from ..config import BookieConfig
from ..errors import BookKeeperError
from ..metadata.store import MetadataStore

COOKIE_FILE = "COOKIE"


class CookieError(BookKeeperError):
    """The bookie's cookies do not match; it must not start (the message says why)."""

    code = -102


def cookie_for(config: BookieConfig, instance_id: str) -> bytes:
    """The cookie this bookie's configuration implies."""
    doc = {
        "format_version": 1,
        "instance_id": instance_id,
        "bookie_id": config.bookie_id,
        "journal_dir": str(Path(config.journal_dir).resolve()),
        "ledger_dirs": [str(Path(d).resolve()) for d in config.ledger_dirs],
    }
    return json.dumps(doc, sort_keys=True).encode()


def _dirs(config: BookieConfig) -> list[Path]:
    return [Path(config.journal_dir), *(Path(d) for d in config.ledger_dirs)]


def _read_local(config: BookieConfig) -> dict[Path, bytes | None]:
    found: dict[Path, bytes | None] = {}
    for d in _dirs(config):
        path = d / COOKIE_FILE
        found[d] = path.read_bytes() if path.exists() else None
    return found


def _write_local(directory: Path, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (COOKIE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / COOKIE_FILE)


async def check_cookies(config: BookieConfig, store: MetadataStore) -> str:
    """Validate (or, on first boot, create) the cookies; return the cluster's instance id.

    Raises:
        CookieError: the cluster is not initialized or the cookies disagree (see module doc).
    """
    instance_id = await store.get_instance_id()
    if instance_id is None:
        raise CookieError(
            "the cluster has no instance id: run "
            "`python -m bookkeeper_aio.shell --metadata URI init-cluster` first"
        )
    expected = cookie_for(config, instance_id)
    local = await asyncio.to_thread(_read_local, config)
    remote = await store.get_cookie(config.bookie_id)
    if remote is None and all(v is None for v in local.values()):
        await store.put_cookie(config.bookie_id, expected, None)
        for d in local:
            await asyncio.to_thread(_write_local, d, expected)
        return instance_id
    _compare(config, expected, local, remote.value if remote else None)
    return instance_id


def _compare(
    config: BookieConfig, expected: bytes, local: dict[Path, bytes | None], remote: bytes | None
) -> None:
    fix = (
        "If the data is really gone (disk replaced), delete the bookie's cookie in the "
        "metadata store and its COOKIE files so it joins as a new bookie, and let "
        "autorecovery re-replicate its ledgers."
    )
    if remote is None:
        raise CookieError(
            f"bookie {config.bookie_id} has local cookies but none in the metadata store "
            f"(wrong --metadata URI, or the cookie was deleted). {fix}"
        )
    other = json.loads(remote)
    mine = json.loads(expected)
    if other.get("instance_id") != mine["instance_id"]:
        raise CookieError(
            f"bookie {config.bookie_id} belongs to cluster {other.get('instance_id')}, "
            f"not to {mine['instance_id']} (wrong --metadata URI?)"
        )
    if remote != expected:
        raise CookieError(
            f"bookie {config.bookie_id}: its dirs changed since the cookie was written "
            f"(cookie: journal {other.get('journal_dir')}, ledgers {other.get('ledger_dirs')}). "
            f"Restore the previous --journal-dir/--ledger-dir set. {fix}"
        )
    for d, data in local.items():
        if data is None:
            raise CookieError(
                f"bookie {config.bookie_id}: {d} has no COOKIE file while the cluster knows "
                f"this bookie: the disk was wiped or replaced and entries may be missing. {fix}"
            )
        if data != remote:
            raise CookieError(f"bookie {config.bookie_id}: the COOKIE in {d} differs. {fix}")
