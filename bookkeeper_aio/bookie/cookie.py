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

A dir without its cookie (wiped or replaced) is the one mismatch that can be repaired without
knowing what was lost (BP-46): fence and put in limbo every open ledger this bookie serves
before serving, restamp the cookies, and copy the missing entries from peers in the background
(integrity.py). The bookie does that on its own with ``cookie_auto_fix``; otherwise it refuses
to start until an operator approves it once with
``python -m bookkeeper_aio.shell --metadata URI cookie-fix --bookie ID``, which marks the store
cookie (``"fix_requested": true``); the bookie's restamp clears the mark.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..config import BookieConfig
from ..errors import BookKeeperError, MetadataVersionError
from ..metadata.store import MetadataStore
from .journal_files import fsync_dir

COOKIE_FILE = "COOKIE"
FIX_REQUESTED = "fix_requested"  # set in the store cookie by `shell cookie-fix`

log = logging.getLogger(__name__)


class CookieError(BookKeeperError):
    """The bookie's cookies do not match; it must not start (the message says why)."""

    code = -102


@dataclass(frozen=True)
class CookieCheck:
    """What :func:`check_cookies` found.

    ``repair`` is None when the cookies are fine; otherwise it says why this bookie must run
    the BP-46 phase one (fence + limbo) before :func:`restamp_cookies` and serving.
    """

    instance_id: str
    repair: str | None = None
    missing: tuple[Path, ...] = ()
    store_version: int | None = None
    # BP-31 bookie incarnation: drawn when the cookie is first written (a bookie formatted
    # again gets a new one); "" for a cookie written before incarnations existed.
    incarnation: str = ""


def cookie_for(config: BookieConfig, instance_id: str, incarnation: str = "") -> bytes:
    """The cookie this bookie's configuration implies (with its incarnation, if any)."""
    doc: dict[str, object] = {
        "format_version": 1,
        "instance_id": instance_id,
        "bookie_id": config.bookie_id,
        "journal_dir": str(Path(config.journal_dir).resolve()),
        "ledger_dirs": [str(Path(d).resolve()) for d in config.ledger_dirs],
    }
    if incarnation:
        doc["incarnation"] = incarnation
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
    fsync_dir(directory)  # the rename too: a crash must not take a written cookie back


async def check_cookies(config: BookieConfig, store: MetadataStore) -> CookieCheck:
    """Validate (or, on first boot, create) the cookies.

    Raises:
        CookieError: the cluster is not initialized or the cookies disagree in a way that is
            not repairable, or repairable but neither ``cookie_auto_fix`` nor an operator's
            ``cookie-fix`` allows it (see module doc).
    """
    instance_id = await store.get_instance_id()
    if instance_id is None:
        raise CookieError(
            "the cluster has no instance id: run "
            "`python -m bookkeeper_aio.shell --metadata URI init-cluster` first"
        )
    local = await asyncio.to_thread(_read_local, config)
    remote = await store.get_cookie(config.bookie_id)
    if remote is None and all(v is None for v in local.values()):
        incarnation = uuid.uuid4().hex  # a new bookie, or one formatted again (BP-31)
        expected = cookie_for(config, instance_id, incarnation)
        await store.put_cookie(config.bookie_id, expected, None)
        for d in local:
            await asyncio.to_thread(_write_local, d, expected)
        log.info("bookie %s: new cookie, incarnation %s", config.bookie_id, incarnation)
        return CookieCheck(instance_id, incarnation=incarnation)
    if remote is None:
        raise CookieError(
            f"bookie {config.bookie_id} has local cookies but none in the metadata store "
            f"(wrong --metadata URI, or the cookie was deleted). {_DECOMMISSION}"
        )
    stored, fix_requested = _identity(remote.value)
    incarnation = str(json.loads(stored).get("incarnation", ""))
    expected = cookie_for(config, instance_id, incarnation)
    _compare(config, expected, local, stored)
    missing = tuple(d for d, data in local.items() if data is None)
    if not missing:
        if fix_requested:  # approved but nothing to fix: drop the approval, never keep it armed
            await store.put_cookie(config.bookie_id, expected, remote.version)
            log.info("bookie %s: cookie fix requested but the cookies are intact", config.bookie_id)
        return CookieCheck(instance_id, incarnation=incarnation)
    dirs = ", ".join(str(d) for d in missing)
    if not (config.cookie_auto_fix or fix_requested):
        raise CookieError(
            f"bookie {config.bookie_id}: {dirs} has no COOKIE file while the cluster knows this "
            "bookie: the disk was wiped or replaced and acknowledged entries may be missing. "
            "To let the bookie fence and put in limbo its open ledgers, restamp its cookies "
            "and copy the missing entries from its peers, run `python -m bookkeeper_aio.shell "
            f"--metadata URI cookie-fix --bookie {config.bookie_id}` and start it again (or "
            f"start it with --cookie-auto-fix true). {_DECOMMISSION}"
        )
    how = "cookie_auto_fix" if config.cookie_auto_fix else "cookie-fix requested"
    return CookieCheck(
        instance_id, f"no cookie in {dirs} ({how})", missing, remote.version, incarnation
    )


async def restamp_cookies(config: BookieConfig, store: MetadataStore, check: CookieCheck) -> None:
    """After phase one: write the missing dirs' cookies, then the store's (clearing a fix
    request). Only the request flag may have changed meanwhile; anything else raises."""
    expected = cookie_for(config, check.instance_id, check.incarnation)
    for d in check.missing:
        await asyncio.to_thread(_write_local, d, expected)
    version = check.store_version
    for _ in range(3):
        try:
            await store.put_cookie(config.bookie_id, expected, version)
            log.warning("bookie %s: cookies restamped in %s",
                        config.bookie_id, ", ".join(map(str, check.missing)))  # fmt: skip
            return
        except MetadataVersionError as exc:
            current = exc.current
            if current is None or _identity(current.value)[0] != expected:
                raise CookieError(
                    f"bookie {config.bookie_id}: the store cookie changed during the repair"
                ) from exc
            version = current.version
    raise CookieError(f"bookie {config.bookie_id}: the store cookie keeps changing")


async def request_cookie_fix(store: MetadataStore, bookie_id: str) -> str:
    """``shell cookie-fix``: approve, once, the repair of a bookie whose dirs lost their
    cookies (see module doc). Raises CookieError when the store has no cookie for it."""
    for _ in range(3):
        found = await store.get_cookie(bookie_id)
        if found is None:
            raise CookieError(
                f"no cookie for bookie {bookie_id} in the metadata store: nothing to fix "
                "(a new bookie writes its own cookie on first boot)"
            )
        doc = json.loads(found.value)
        if doc.get(FIX_REQUESTED):
            return f"cookie fix for {bookie_id} already requested; start the bookie"
        doc[FIX_REQUESTED] = True
        try:
            await store.put_cookie(bookie_id, json.dumps(doc, sort_keys=True).encode(),
                                   found.version)  # fmt: skip
        except MetadataVersionError:
            continue
        return (
            f"cookie fix requested for {bookie_id}: on its next start it fences and puts in "
            "limbo its open ledgers, restamps its cookies, then serves and copies missing "
            "entries from its peers"
        )
    raise CookieError(f"the cookie of {bookie_id} keeps changing; try again")


_DECOMMISSION = (
    "If the bookie should instead join as a new one, delete its cookie in the metadata store "
    "and its COOKIE files, and let autorecovery re-replicate its ledgers."
)


def _identity(stored: bytes) -> tuple[bytes, bool]:
    """The store cookie without the fix request (comparable to :func:`cookie_for`), and the
    request flag."""
    doc = json.loads(stored)
    requested = bool(doc.pop(FIX_REQUESTED, False))
    return json.dumps(doc, sort_keys=True).encode(), requested


def _compare(
    config: BookieConfig, expected: bytes, local: dict[Path, bytes | None], stored: bytes
) -> None:
    """Raise CookieError for every mismatch except dirs that lost their cookie."""
    other = json.loads(stored)
    mine = json.loads(expected)
    if other.get("instance_id") != mine["instance_id"]:
        raise CookieError(
            f"bookie {config.bookie_id} belongs to cluster {other.get('instance_id')}, "
            f"not to {mine['instance_id']} (wrong --metadata URI?)"
        )
    if stored != expected:
        raise CookieError(
            f"bookie {config.bookie_id}: its dirs changed since the cookie was written "
            f"(cookie: journal {other.get('journal_dir')}, ledgers {other.get('ledger_dirs')}). "
            f"Restore the previous --journal-dir/--ledger-dir set. {_DECOMMISSION}"
        )
    for d, data in local.items():
        if data is not None and data != expected:
            raise CookieError(
                f"bookie {config.bookie_id}: the COOKIE in {d} differs. {_DECOMMISSION}"
            )
