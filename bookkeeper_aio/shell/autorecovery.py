"""Autorecovery admin commands: list-under-replicated, ledger-check, audit, decommission,
autorecovery-status (docs/durability.md). Long ones show a tqdm progress bar on stderr.

Each returns the text to print and the exit status (``ledger-check`` exits 1 when a copy is
missing; ``decommission`` exits 0 only once the bookie holds nothing any ledger needs).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import AsyncIterator

from tqdm import tqdm

from ..autorecovery import state
from ..autorecovery.audit import audit_all
from ..autorecovery.checker import check_ledger
from ..autorecovery.decommission import decommission as decommission_bookie
from ..autorecovery.election import current_auditor
from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import ClientConfig
from ..metadata.store import MetadataStore, open_metadata_store
from ..metadata.underreplication import Mark, list_marks, lock_holder
from ..net import TcpNetwork


def wall_ms() -> int:
    return int(time.time() * 1000)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


@contextlib.asynccontextmanager
async def _context(uri: str) -> AsyncIterator[ClientContext]:
    config, rng = ClientConfig(), random.Random()
    async with open_metadata_store(uri) as store, BookiePool(TcpNetwork(), config, rng) as pool:
        yield ClientContext(config, store, pool, rng, PlacementPolicy())


async def list_under_replicated(uri: str, as_json: bool = False) -> tuple[str, int]:
    """Every mark: ledger, missing copies, since when, why, who works on it (``as_json``: a
    JSON object per line)."""
    lines = []
    async with open_metadata_store(uri) as store:
        async for versioned in list_marks(store):
            mark = versioned.value
            if as_json:
                lines.append(json.dumps(await _mark_doc(store, mark)))
                continue
            copies = ", ".join(
                f"{m.bookie}: {'all' if m.entry_count() is None else m.entry_count()} entries"
                for m in mark.missing
            )
            holder = await lock_holder(store, mark.ledger_id)
            line = (f"{mark.ledger_id}\tmissing {copies}\tsince {_when(mark.since_ms)}\t"
                    f"why {', '.join(mark.reasons())}")  # fmt: skip
            if holder:
                line += f"\tworker {holder}"
            if mark.attempts:
                line += f"\tattempts {mark.attempts}: {mark.last_error}"
            lines.append(line)
    return ("\n".join(lines) if lines or as_json else "no under-replicated ledgers"), 0


async def _mark_doc(store: MetadataStore, mark: Mark) -> dict[str, object]:
    return {
        "ledger_id": mark.ledger_id,
        "since_ms": mark.since_ms,
        "reasons": mark.reasons(),
        "attempts": mark.attempts,
        "last_error": mark.last_error,
        "worker": await lock_holder(store, mark.ledger_id),
        "missing_replicas": [
            {"bookie": m.bookie, "entries": m.entry_count()} for m in mark.missing
        ],
    }


async def ledger_check(uri: str, ledger_id: int) -> tuple[str, int]:
    """Every fragment of one ledger: which bookie lacks which entries (exit 1 if any)."""
    async with _context(uri) as ctx:
        md = (await ctx.metadata.read_ledger(ledger_id)).value
        registered = set(await ctx.metadata.list_bookies())
        gone = set(await state.lost_bookies(ctx.metadata)) - registered
        gone |= set(await state.decommissioning(ctx.metadata))
        check = await check_ledger(ctx, md, registered, gone)
    lines = [f"ledger {ledger_id} {md.state.value} E{md.ensemble_size}/WQ{md.write_quorum}/"
             f"AQ{md.ack_quorum} last entry {md.last_entry_id}"]  # fmt: skip
    for r in check.rows:
        end = "open" if r.last is None else str(r.last)
        detail = r.status
        if r.status in ("missing", "lost", "error") and r.missing:
            ranges = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in r.missing[:20])
            more = " ..." if len(r.missing) > 20 else ""
            lacks = sum(b - a + 1 for a, b in r.missing)
            detail += f": lacks {lacks} of {r.expected} ({ranges}{more})"
        elif r.status == "ok":
            detail += f": {r.expected} entries"
        lines.append(f"  segment {r.first}-{end}  [{r.index}] {r.bookie}  {detail}")
    short = not check.complete
    lines.append("copies missing" if short else "every copy is there")
    return "\n".join(lines), 1 if short else 0


async def audit(uri: str, in_flight_max: int = 16) -> tuple[str, int]:
    """Check every ledger now and mark what is short (progress bar on stderr)."""
    async with _context(uri) as ctx:
        total = len([i async for i in ctx.metadata.list_ledgers()])
        registered = set(await ctx.metadata.list_bookies())
        gone = set(await state.lost_bookies(ctx.metadata)) - registered
        gone |= set(await state.decommissioning(ctx.metadata))
        with tqdm(total=total, desc="audit", unit="ledger") as bar:
            result = await audit_all(ctx, registered, gone, in_flight_max, wall_ms, bar.update)
    text = (f"{result.ledgers} ledgers checked: {result.marked} marked under-replicated, "
            f"{result.incomplete} with a bookie that could not be asked")  # fmt: skip
    return text, 0


async def decommission(uri: str, bookie: str, timeout_s: float | None) -> tuple[str, int]:
    """Move every copy off ``bookie``, wait, remove its cookie (progress bar on stderr)."""
    async with _context(uri) as ctx:
        with tqdm(desc=f"decommission {bookie}", unit="ledger") as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.n = done
                bar.refresh()

            text = await decommission_bookie(ctx, bookie, wall_ms, progress, timeout_s=timeout_s)
    return text, 0


async def autorecovery_status(uri: str) -> tuple[str, int]:
    """The auditor, its SLA figures, the processes, lost and leaving bookies (JSON)."""
    async with open_metadata_store(uri) as store:
        found = await store.get(state.AUDITOR_STATS_KEY)
        doc = {
            "auditor": await current_auditor(store),
            "auditor_statistics": state.decode("stats", found.value) if found else None,
            "processes": await state.process_statistics(store),
            "lost": await state.lost_bookies(store),
            "decommissioning": await state.decommissioning(store),
        }
    return json.dumps(doc, indent=2, sort_keys=True), 0
