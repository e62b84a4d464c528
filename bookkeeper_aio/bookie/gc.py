"""A bookie's garbage collector: phase two of BP-31's explicit, two-phase deletes.

Theory of operation
-------------------
One pass (``Bookie.collect_garbage``, every ``gc_interval_s`` and on demand):

1. Take the ledgers the engine holds, *then* list the ledgers that have metadata, *then* the
   tombstones (``metadata/tombstones.py``). In that order a ledger created meanwhile is
   either listed live or not held yet, and one deleted meanwhile is either listed live (kept
   this pass) or tombstoned.
2. A held ledger with metadata is live: kept, unless it is an **extra copy** (below). One
   **explicitly tombstoned** and without metadata is deleted: dropped from the handler's
   cache, deleted in the engine. One with neither is an **orphan**: never deleted, only
   counted, listed and logged (its key may have been removed by hand, or its tombstone
   expired while this bookie was away).
3. The deletes are made durable (a journal checkpoint: the engine synced, the journal records
   of those ledgers dropped, so a replay cannot bring them back) *before* this bookie
   confirms them in their tombstones; the bookie that completes a tombstone removes it.
   Tombstones naming this bookie whose ledgers it does not hold are confirmed at once.
4. The engine reclaims space (RocksDB compacts the deleted ranges; the files engine compacts
   entry logs whose live fraction fell below ``compaction_live_ratio_min``).
5. Tombstones older than ``tombstone_ttl_s`` are removed whoever has not confirmed them.

**Extra copies** (BookKeeper's over-replicated ledger GC), deleted in step 2 and made durable
in step 3: a held ledger with metadata whose every ensemble lacks this bookie (autorecovery
replaced it while it was away, or a decommission moved its data), once it has been seen so,
CLOSED, with no under-replication mark and at the same metadata version, for
``gc_overreplicated_wait_s`` (one day). They are looked for every quarter of that time (the
first time a quarter after the first pass): the metadata of at most
``gc_overreplicated_checks_max`` held ledgers is read then, in turns. What is deleted is a
copy the metadata no longer counts: every entry still has its write quorum's copies on the
bookies the ensembles name. A copy a replication worker is writing here is not extra yet: the
worker holds the ledger's mark while it copies. So a ledger due for deletion is checked once
more with adds to it refused by the handler (``hold``) and deleted before they are taken
again: a copy begun since the first check shows as its mark, or is refused (the worker tries
again later) and never acknowledged and then deleted. After the delete the handler refuses
writers' adds to the ledger (as to any ledger deleted here) but takes copies of it again: a
worker that chose this bookie as a target from a check made before the delete finds, in the
check that ends its job, what the delete took, and copies it (worker.py, step 6). (Refusing
those copies too kept such a job failing until the bookie restarted.)
The times seen are in memory: a restart waits the whole time again.

A bookie away longer than the TTL (its last pass, recorded in ``gc/bookies/<id>``, is older
than that) may hold ledgers whose tombstones expired meanwhile: it cannot tell them from real
orphans. It says so (a warning, ``away_longer_than_ttl`` in its figures, sticky until it is
formatted again: a new incarnation) and keeps them — the seed's "decommission and add as new".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import BookieConfig
from ..engine import Engine
from ..errors import MetadataFormatError, NoSuchLedgerError
from ..metadata.model import LedgerState, Versioned
from ..metadata.store import MetadataStore
from ..metadata.tombstones import GC_BOOKIES_PREFIX, Tombstone, confirm, list_tombstones, remove
from ..metadata.underreplication import read_mark

log = logging.getLogger(__name__)

ORPHANS_LISTED_MAX = 100  # ids of orphans kept in the figures (all are counted)
_EXTRA_CHECKS_PER_WAIT = 4  # extra copies are looked for every gc_overreplicated_wait_s / 4


class GarbageCollector:
    """See the module docstring. ``checkpoint`` makes the engine's deletes durable;
    ``reclaim`` runs the engine's space reclamation where blocking belongs (bytes freed)."""

    def __init__(
        self,
        config: BookieConfig,
        engine: Engine,
        metadata: MetadataStore,
        *,
        incarnation: str,
        forget: Callable[[int, bool], None],
        hold: Callable[[int, bool], None],
        checkpoint: Callable[[], Awaitable[None]],
        reclaim: Callable[[float], Awaitable[int]],
        wall_clock_ms: Callable[[], int],
    ) -> None:
        self.config = config
        self.engine = engine
        self.metadata = metadata
        self.bookie_id = config.bookie_id
        self.incarnation = incarnation
        self._forget = forget
        self._hold = hold  # (ledger, True): the handler refuses adds to it until (ledger, False)
        self._checkpoint = checkpoint
        self._reclaim = reclaim
        self._clock_ms = wall_clock_ms
        self.counters: dict[str, int] = dict.fromkeys(
            ("passes", "ledgers_deleted", "bytes_freed", "tombstones_confirmed",
             "tombstones_removed", "tombstones_expired", "delete_errors",
             "extra_copies_deleted"), 0,
        )  # fmt: skip
        self.last: dict[str, Any] = {}
        self.orphans: list[int] = []
        self.away_longer_than_ttl = False
        # Held ledgers seen as extra copies: (metadata version, wall ms when first seen so).
        self._extra: dict[int, tuple[int, int]] = {}
        self._extra_cursor = -1  # the last ledger id checked: the next pass goes on after it
        self._extra_next_ms: int | None = None  # when extra copies are checked next

    def statistics(self) -> dict[str, Any]:
        """Totals, the last pass's figures, the orphans now."""
        return {
            **self.counters,
            "orphans": len(self.orphans),
            "orphan_ids": self.orphans[:ORPHANS_LISTED_MAX],
            "away_longer_than_ttl": self.away_longer_than_ttl,
            "last_pass": dict(self.last),
        }

    async def collect(self) -> dict[str, Any]:
        """One pass (module docstring); its figures, JSON-able."""
        now_ms = self._clock_ms()
        await self._check_away(now_ms)
        held = set(self.engine.ledgers())
        live = {i async for i in self.metadata.list_ledgers()}
        stones = [s async for s in list_tombstones(self.metadata)]
        doomed = {s.value.ledger_id for s in stones} & (held - live)
        deleted, errors = self._delete(sorted(doomed))
        extra, extra_errors = await self._extra_copies(held & live, now_ms)
        errors += extra_errors
        if deleted or extra:
            await self._checkpoint()  # durable before any tombstone hears of it
        orphans = sorted(held - live - doomed)
        self._report_orphans(orphans)
        confirmed, removed, expired = await self._settle(stones, held, set(deleted), now_ms)
        freed = await self._reclaim(self.config.compaction_live_ratio_min)
        figures = {
            "ledgers_deleted": len(deleted),
            "bytes_freed": freed,
            "orphans": len(orphans),
            "orphan_ids": orphans[:ORPHANS_LISTED_MAX],
            "tombstones_seen": len(stones),
            "tombstones_confirmed": confirmed,
            "tombstones_removed": removed,
            "tombstones_expired": expired,
            "delete_errors": errors,
            "extra_copies_deleted": len(extra),
            "extra_copies_waiting": len(self._extra),
            "ledgers_held": len(held) - len(deleted) - len(extra),
            "away_longer_than_ttl": self.away_longer_than_ttl,
        }
        self._count(figures)
        await self._record_pass(now_ms)
        return figures

    def _delete(self, ledger_ids: list[int], extra: bool = False) -> tuple[list[int], int]:
        """Delete the ledgers here (``extra``: extra copies of live ledgers, which the handler
        then refuses adds to but takes copies of again); the deleted and the failures."""
        deleted, errors = [], 0
        for ledger_id in ledger_ids:
            try:
                self._forget(ledger_id, extra)
                self.engine.delete_ledger(ledger_id)
                deleted.append(ledger_id)
            except OSError as exc:  # a failed dir: its ledgers are re-replicated elsewhere
                errors += 1
                log.error("gc: could not delete ledger %d: %s", ledger_id, exc)
        if deleted:
            what = "extra" if extra else "tombstoned"
            log.info("gc: bookie %s deleted %d %s ledgers: %s", self.bookie_id, len(deleted), what,
                     deleted[:ORPHANS_LISTED_MAX])  # fmt: skip
        return deleted, errors

    async def _extra_copies(self, candidates: set[int], now_ms: int) -> tuple[list[int], int]:
        """Delete the held ledgers (``candidates``: with metadata) whose copy here has been
        extra for ``gc_overreplicated_wait_s`` (module docstring); reads the metadata of at
        most ``gc_overreplicated_checks_max`` of them, in turns over the passes. Returns the
        ledgers deleted and the deletes that failed."""
        wait_ms = self.config.gc_overreplicated_wait_s * 1000
        self._extra = {i: seen for i, seen in self._extra.items() if i in candidates}
        if wait_ms <= 0:
            return [], 0
        # Checked every quarter of the wait, the first time a quarter after the first pass:
        # not every pass (a metadata read per held ledger), and never in a bookie's first
        # minutes (nothing is a day old then).
        if self._extra_next_ms is None:
            self._extra_next_ms = now_ms + int(wait_ms / _EXTRA_CHECKS_PER_WAIT)
        if now_ms < self._extra_next_ms or not candidates:
            return [], 0
        self._extra_next_ms = now_ms + int(wait_ms / _EXTRA_CHECKS_PER_WAIT)
        ordered = sorted(candidates)
        start = next((n for n, i in enumerate(ordered) if i > self._extra_cursor), 0)
        turn = (ordered[start:] + ordered[:start])[: self.config.gc_overreplicated_checks_max]
        deleted, errors = [], 0
        for ledger_id in turn:
            self._extra_cursor = ledger_id
            version = await self._extra_version(ledger_id)
            seen = self._extra.get(ledger_id)
            if version is None:
                self._extra.pop(ledger_id, None)
            elif seen is None or seen[0] != version:
                self._extra[ledger_id] = (version, now_ms)  # (again) from now
            elif now_ms - seen[1] >= wait_ms:
                # Checked again with adds to it refused meanwhile: a copy a replication worker
                # began since the first check is either refused or seen here (its mark).
                self._hold(ledger_id, True)
                try:
                    if await self._extra_version(ledger_id) == version:
                        done, failed = self._delete([ledger_id], extra=True)
                        deleted += done
                        errors += failed
                finally:
                    self._hold(ledger_id, False)
                del self._extra[ledger_id]
        return deleted, errors

    async def _extra_version(self, ledger_id: int) -> int | None:
        """The metadata version of the ledger if this bookie's copy of it is extra now:
        CLOSED, in none of its ensembles, no under-replication mark; else None."""
        try:
            current = await self.metadata.read_ledger(ledger_id)
        except NoSuchLedgerError:  # deleted since the listing: the tombstones' business
            return None
        md = current.value
        if (
            md.state is not LedgerState.CLOSED
            or any(self.bookie_id in ensemble for _, ensemble in md.ensembles)
            or await read_mark(self.metadata, ledger_id) is not None
        ):
            return None
        return current.version

    async def _settle(
        self, stones: list[Versioned[Tombstone]], held: set[int], deleted: set[int], now_ms: int
    ) -> tuple[int, int, int]:
        """Confirm what this bookie no longer holds; remove expired tombstones."""
        confirmed = removed = expired = 0
        for stone in stones:
            t = stone.value
            if t.expired(now_ms, self.config.tombstone_ttl_s):
                if await remove(self.metadata, stone):
                    expired += 1
                    log.warning("gc: tombstone of ledger %d expired unconfirmed by %s", t.ledger_id,
                                ",".join(sorted(set(t.bookies) - set(t.confirmed))))  # fmt: skip
                continue
            mine = self.bookie_id in t.bookies and self.bookie_id not in t.confirmed
            if not mine or (t.ledger_id in held and t.ledger_id not in deleted):
                continue
            outcome = await confirm(self.metadata, stone, self.bookie_id)
            removed += outcome == "removed"
            confirmed += outcome != "gone"
        return confirmed, removed, expired

    def _report_orphans(self, orphans: list[int]) -> None:
        new = sorted(set(orphans) - set(self.orphans))
        self.orphans = orphans
        if new:
            why = (" (this bookie was away longer than tombstone_ttl_s: some may be deleted "
                   "ledgers whose tombstones expired; it cannot check them, so it keeps them: "
                   "decommission it and add it as a new bookie to reclaim the space)"
                   if self.away_longer_than_ttl else "")  # fmt: skip
            log.warning("gc: bookie %s holds %d ledgers without metadata or tombstone (orphans, "
                        "kept, never deleted): %s%s", self.bookie_id, len(new),
                        new[:ORPHANS_LISTED_MAX], why)  # fmt: skip

    def _count(self, figures: dict[str, Any]) -> None:
        c = self.counters
        c["passes"] += 1
        for key in ("ledgers_deleted", "bytes_freed", "tombstones_confirmed",
                    "tombstones_removed", "tombstones_expired", "delete_errors",
                    "extra_copies_deleted"):  # fmt: skip
            c[key] += figures[key]
        self.last = figures

    # --- away longer than the TTL -----------------------------------------------------------

    async def _check_away(self, now_ms: int) -> None:
        found = await self.metadata.get(GC_BOOKIES_PREFIX + self.bookie_id)
        if found is None:
            return  # the first pass of this bookie
        try:
            doc = json.loads(found.value)
            last_ms, stale = int(doc["last_pass_ms"]), bool(doc.get("away_longer_than_ttl"))
            same = doc.get("incarnation", "") == self.incarnation
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataFormatError(f"invalid gc record of {self.bookie_id}: {exc}") from exc
        away = now_ms - last_ms > self.config.tombstone_ttl_s * 1000
        if away and not self.away_longer_than_ttl:
            log.warning("gc: bookie %s was away %.0f s, longer than tombstone_ttl_s=%s: it keeps "
                        "every ledger without metadata (it cannot check them)", self.bookie_id,
                        (now_ms - last_ms) / 1000, self.config.tombstone_ttl_s)  # fmt: skip
        self.away_longer_than_ttl = same and (stale or away)

    async def _record_pass(self, now_ms: int) -> None:
        doc = {"last_pass_ms": now_ms, "incarnation": self.incarnation,
               "away_longer_than_ttl": self.away_longer_than_ttl}  # fmt: skip
        await self.metadata.put(GC_BOOKIES_PREFIX + self.bookie_id, json.dumps(doc).encode())
