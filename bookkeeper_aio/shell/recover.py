"""``recover-metadata``: rebuild the ledgers' metadata from the bookies after the metadata store
was lost (BP-31 "metadata recovery tool"; the records and the choice among them are in
``metadata/ledger_record.py``).

Steps: refuse if the store still has ledgers (unless ``--merge``: then only the ledgers it
lacks are added and the ones it has are kept as they are); ask every registered bookie (and
every ``--bookie``) for what it holds per ledger, with the LEDGER_RECORDS request, page by
page; choose each ledger's most advanced record; store each one under its own id, create-only
(a ledger id already taken is kept, never overwritten). Progress bars on stderr.

Ledger ids are drawn at random (1 .. 2^63-1) and a create succeeds only where no ledger
exists, so there is no id counter to restore: once the restored ledgers are back, a new
ledger cannot take one of their ids. A ledger created between the loss and the recovery
under an id the lost store had (a chance of about n/2^63) is reported as kept, not replaced.
"""

from __future__ import annotations

import random
from typing import Any

from tqdm import tqdm

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..client.reads import request
from ..config import ClientConfig
from ..errors import BookKeeperError, MetadataFormatError, StatusCode
from ..metadata.ledger_record import Held, Rebuilt, rebuild, unpack_held
from ..metadata.model import LedgerState
from ..metadata.store import MetadataStore, open_metadata_store
from ..net import TcpNetwork
from ..protocol import LedgerRecordsRequest, LedgerRecordsResponse

PAGE = 1_000


async def recover_metadata(uri: str, merge: bool, bookies: list[str]) -> tuple[str, int]:
    """See the module docstring; exit status 1 if a bookie could not be asked or a ledger
    could not be rebuilt."""
    config, rng = ClientConfig(), random.Random()
    async with open_metadata_store(uri) as store, BookiePool(TcpNetwork(), config, rng) as pool:
        present = await _ledger_count(store)
        if present and not merge:
            raise BookKeeperError(
                f"the metadata store still has {present} ledgers: recover-metadata rebuilds a "
                "lost store. Run it with --merge to add only the ledgers it lacks (those it "
                "has are kept as they are)"
            )
        asked = sorted(set(await store.list_bookies()) | set(bookies))
        if not asked:
            raise BookKeeperError("no bookie to ask: none is registered; name them with --bookie")
        ctx = ClientContext(config, store, pool, rng, PlacementPolicy())
        holdings, failed = await _collect(ctx, asked)
        rebuilt = rebuild(holdings)
        restored, kept = await _restore(store, rebuilt)
    return _report(asked, failed, rebuilt, restored, kept)


async def _ledger_count(store: MetadataStore) -> int:
    return len([i async for i in store.list_ledgers()])


async def _collect(
    ctx: ClientContext, bookies: list[str]
) -> tuple[dict[str, list[Held]], dict[str, str]]:
    """What each bookie holds per ledger; the bookies that could not be asked, and why."""
    holdings: dict[str, list[Held]] = {}
    failed: dict[str, str] = {}
    with tqdm(desc="ledger records", unit="ledger") as bar:
        for bookie in bookies:
            try:
                holdings[bookie] = await _records_of(ctx, bookie, bar.update)
            except BookKeeperError as exc:
                failed[bookie] = str(exc)
    return holdings, failed


async def _records_of(ctx: ClientContext, bookie: str, progress: Any) -> list[Held]:
    items: list[Held] = []
    start = 0
    while start >= 0:
        answer: Any = await request(ctx, bookie, LedgerRecordsRequest, start, PAGE)
        if type(answer) is not LedgerRecordsResponse or answer.status != StatusCode.OK:
            raise BookKeeperError(f"bookie {bookie} did not answer LEDGER_RECORDS: "
                                  f"{answer!r:.200}")  # fmt: skip
        try:
            items += [unpack_held(data) for data in answer.records]
        except MetadataFormatError as exc:
            raise BookKeeperError(f"bookie {bookie}: {exc}") from exc
        progress(len(answer.records))
        if answer.next_ledger_id >= 0 and answer.next_ledger_id <= start:
            raise BookKeeperError(f"bookie {bookie}: LEDGER_RECORDS went backwards")
        start = answer.next_ledger_id
    return items


async def _restore(store: MetadataStore, rebuilt: Rebuilt) -> tuple[list[int], list[int]]:
    """Store every rebuilt ledger create-only; (restored ids, ids kept as the store had them)."""
    restored, kept = [], []
    with tqdm(total=len(rebuilt.ledgers), desc="restore", unit="ledger") as bar:
        for ledger_id, md in rebuilt.ledgers.items():
            if await store.restore_ledger(md) is None:
                kept.append(ledger_id)
            else:
                restored.append(ledger_id)
            bar.update()
    return restored, kept


def _report(
    asked: list[str],
    failed: dict[str, str],
    rebuilt: Rebuilt,
    restored: list[int],
    kept: list[int],
) -> tuple[str, int]:
    reopened = sum(1 for i in restored if rebuilt.ledgers[i].state is not LedgerState.CLOSED)
    lines = [
        f"{len(asked) - len(failed)} of {len(asked)} bookies asked",
        f"{len(restored)} ledgers restored ({reopened} not closed: their first reader recovers "
        f"them), {len(kept)} already in the store (kept)",
    ]
    for bookie, why in failed.items():
        lines.append(f"bookie {bookie} could not be asked: {why}")
    if rebuilt.bad_records:
        lines.append(f"{rebuilt.bad_records} unreadable records ignored")
    for ledger_id, holders in rebuilt.unrecoverable.items():
        lines.append(f"ledger {ledger_id}: no bookie keeps its metadata (held by "
                     f"{', '.join(holders)}): not restored")  # fmt: skip
    return "\n".join(lines), 1 if failed or rebuilt.unrecoverable else 0
