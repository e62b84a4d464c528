"""BP-46 data integrity: limbo on boot, then repair from peers (``journal_write_data=false``).

Theory of operation
-------------------
Without the journal, a bookie that crashed may have lost entries it acknowledged. Answering
"no such entry" for them could let a recovery truncate acknowledged data (BP-46 scenario 2),
and accepting adds for a ledger whose writer was meanwhile recovered could acknowledge an
entry past the close (scenario 1). So, when the last shutdown was unclean (or a dir lost its
data), **before serving** (:meth:`DataIntegrity.preboot`), every non-closed ledger whose
ensembles contain this bookie is put in **limbo** and **fenced**: the handler then answers
UNKNOWN instead of any negative (missing entry, LAC) and refuses normal adds.

In the background (:meth:`DataIntegrity.check`, at boot and every
``data_integrity_check_interval_s``):

1. each limbo ledger is recovered through the cluster (fence, read forward, close), with the
   master key the bookie holds; a key lost with the data is learned from the first client that
   fences or recovery-adds, until then the ledger waits in limbo (or until it is closed: then
   there is nothing to recover, only entries to copy);
2. every entry this bookie should hold — its write sets up to the last entry of a closed
   ledger, or up to the start of the last segment of an open one — is checked, and missing ones
   are copied from peers (a digest-verified copy, at most ``data_integrity_copies_in_flight_max``
   at once). This also repairs entries left at ack quorum by an ensemble change;
3. then limbo is cleared (the ledger stays fenced).

Progress goes to the log and to :meth:`statistics`. Bug switches for the simulator:
``no-limbo`` (fence on boot but answer negatives), ``no-fence-on-boot`` (skip the preboot
entirely) and ``crash-always-kept-writes`` (skip it after a power loss too, as after a crash the
system survived: bookie/storage.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..client.reads import read_copy
from ..client.recovery import recover
from ..client.short_copies import ShortCopies
from ..config import BookieConfig, ClientConfig
from ..digest import pack_entry_record, payload_digest
from ..errors import BookKeeperError, NoSuchLedgerError
from ..metadata.model import LedgerMetadata, LedgerState
from ..metadata.store import MetadataStore
from ..net import Network
from ..quorum import write_set
from .handler import UNKNOWN_KEY, RequestHandler

log = logging.getLogger(__name__)

# Simulator only: every unclean shutdown is taken as one the system survived (a power loss
# too), so no limbo after it (bookie/server.py, storage.crash_kept_writes).
CRASH_KEPT_BUG = "crash-always-kept-writes"
BOOKIE_BUGS = frozenset({"no-limbo", "no-fence-on-boot", CRASH_KEPT_BUG})


class DataIntegrity:
    """See the module docstring."""

    def __init__(
        self,
        config: BookieConfig,
        handler: RequestHandler,
        metadata: MetadataStore,
        network: Network,
        *,
        client_config: ClientConfig | None = None,
        rng: random.Random | None = None,
        bugs: frozenset[str] = frozenset(),
    ) -> None:
        assert bugs <= BOOKIE_BUGS, bugs
        self.bookie_id = config.bookie_id
        self.config = config
        self.handler = handler
        self.metadata = metadata
        self.bugs = bugs
        rng = rng or random.Random()
        client_config = client_config or ClientConfig()
        pool = BookiePool(network, client_config, rng)
        self.ctx = ClientContext(client_config, metadata, pool, rng, PlacementPolicy())
        self.counters: Counter[str] = Counter()
        self._fenced_on_boot: dict[int, bytes] = {}  # with no-limbo: repaired like limbo ones

    async def close(self) -> None:
        await self.ctx.pool.close()

    def statistics(self) -> dict[str, int]:
        return {**self.counters, "limbo_ledgers": len(self.handler.limbo_ledgers())}

    # --- phase one: before serving --------------------------------------------------------

    async def preboot(self, reason: str) -> int:
        """Put every non-closed ledger with this bookie in an ensemble in limbo (and fence it);
        return how many. Raises MetadataUnavailableError if the store cannot be read."""
        if "no-fence-on-boot" in self.bugs:
            return 0
        waits: list[asyncio.Future[None]] = []
        async for md in self._my_ledgers():
            if md.is_closed:
                continue
            state = self.handler.ledger(md.ledger_id)
            key = state.master_key if state is not None else UNKNOWN_KEY
            done = asyncio.get_running_loop().create_future()
            waits.append(done)
            limbo = "no-limbo" not in self.bugs
            if not limbo:
                self._fenced_on_boot[md.ledger_id] = key
            self.handler.set_limbo(md.ledger_id, key, limbo, lambda exc, d=done: _settle(d, exc))
        await asyncio.gather(*waits)
        self.counters["limbo_entered"] += len(waits)
        log.warning("bookie %s: %s: %d open ledgers fenced and put in limbo",
                    self.bookie_id, reason, len(waits))  # fmt: skip
        return len(waits)

    async def _my_ledgers(self) -> AsyncIterator[LedgerMetadata]:
        async for ledger_id in self.metadata.list_ledgers():
            try:
                md: LedgerMetadata = (await self.metadata.read_ledger(ledger_id)).value
            except NoSuchLedgerError:
                continue
            if any(self.bookie_id in ensemble for _, ensemble in md.ensembles):
                yield md

    # --- phase two: in the background -----------------------------------------------------

    async def run(self, interval_s: float) -> None:
        """Check now, then every ``interval_s`` (0: until one pass succeeds with nothing left
        in limbo); errors are retried later."""
        while True:
            try:
                await self.check()
                passed = True
            except (BookKeeperError, OSError) as exc:
                passed = False
                self.counters["check_failures"] += 1
                log.warning("bookie %s: integrity check failed (retrying): %s",
                            self.bookie_id, exc)  # fmt: skip
            except Exception:  # unexpected: logged in full, and still retried
                passed = False
                self.counters["check_failures"] += 1
                log.exception("bookie %s: integrity check failed (retrying)", self.bookie_id)
            if interval_s <= 0 and passed and not self.handler.limbo_ledgers():
                log.info("bookie %s: integrity check done", self.bookie_id)
                return
            await asyncio.sleep(interval_s or 1.0)

    async def check(self) -> None:
        """One pass: recover limbo ledgers, copy missing entries, clear limbo."""
        self.counters["passes"] += 1
        to_repair = dict(self._fenced_on_boot)
        to_repair.update(self.handler.limbo_ledgers())
        for ledger_id, key in to_repair.items():
            try:
                if key != UNKNOWN_KEY:
                    md = (await recover(self.ctx, ledger_id, key=key)).value
                else:
                    # Recovering needs the key; once the writer or a recoverer closed the
                    # ledger there is nothing left to recover, only entries to copy.
                    md = (await self.metadata.read_ledger(ledger_id)).value
                    if not md.is_closed:
                        self.counters["limbo_waiting_for_key"] += 1
                        continue
            except NoSuchLedgerError:
                md = None  # deleted meanwhile: nothing to keep
            if md is not None:
                await self._copy_missing(md)
            if self._fenced_on_boot.pop(ledger_id, None) is None:
                await self._leave_limbo(ledger_id, key)
        async for md in self._my_ledgers():
            if not any(lid == md.ledger_id for lid, _ in self.handler.limbo_ledgers()):
                await self._copy_missing(md)
        stats = self.statistics()
        log.info("bookie %s: integrity pass %d: %d entries checked, %d copied, %d in limbo "
                 "(%d waits for a key so far)", self.bookie_id, stats.get("passes", 0),
                 stats.get("entries_checked", 0), stats.get("entries_copied", 0),
                 stats["limbo_ledgers"], stats.get("limbo_waiting_for_key", 0))  # fmt: skip

    async def _leave_limbo(self, ledger_id: int, key: bytes) -> None:
        done = asyncio.get_running_loop().create_future()
        self.handler.set_limbo(ledger_id, key, False, lambda exc: _settle(done, exc))
        await done
        self.counters["limbo_cleared"] += 1
        log.info("bookie %s: ledger %d repaired, out of limbo", self.bookie_id, ledger_id)

    async def _copy_missing(self, md: LedgerMetadata) -> None:
        """Copy from peers every entry of ``md`` this bookie should hold but does not."""
        end = md.last_entry_id if md.state is LedgerState.CLOSED else md.ensembles[-1][0] - 1
        limit = asyncio.Semaphore(self.config.data_integrity_copies_in_flight_max)
        # Entry ids first, coroutines after: a failing disk raising in ``holds`` must not
        # leave coroutines created and never awaited.
        missing: list[tuple[int, list[str]]] = []
        for entry_id in range(end + 1):
            ensemble = md.ensemble_at(entry_id)
            members = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]
            if self.bookie_id not in members:
                continue
            self.counters["entries_checked"] += 1
            if self.handler.holds(md.ledger_id, entry_id):
                continue
            missing.append((entry_id, [b for b in members if b != self.bookie_id]))
        results = await asyncio.gather(
            *(self._copy(md.ledger_id, entry_id, peers, limit) for entry_id, peers in missing)
        )
        failed = [entry_id for entry_id, ok in results if not ok]
        if failed:
            # BP-31: what it cannot repair by itself, autorecovery may (from other replicas,
            # or by replacing this bookie); the periodic check would find it much later.
            await self._short(md.ledger_id, failed)
            raise BookKeeperError(f"ledger {md.ledger_id}: {len(failed)} entries could "
                                  "not be copied from any peer")  # fmt: skip

    async def _short(self, ledger_id: int, entries: list[int]) -> None:
        short = ShortCopies(self.metadata, ledger_id, "integrity check could not repair")
        for entry_id in entries:
            short.add(self.bookie_id, entry_id)
        await short.report()

    async def _copy(
        self, ledger_id: int, entry_id: int, peers: list[str], limit: asyncio.Semaphore
    ) -> tuple[int, bool]:
        async with limit:
            if not await copy_from_peers(self.ctx, self.handler, ledger_id, entry_id, peers):
                self.counters["copy_failures"] += 1
                return entry_id, False
            self.counters["entries_copied"] += 1
            return entry_id, True


async def copy_from_peers(
    ctx: ClientContext, handler: RequestHandler, ledger_id: int, entry_id: int, peers: list[str]
) -> bool:
    """Store here a digest-verified copy of the entry from the first of ``peers`` that has one
    (as durable as an add once it returns True); False if none has. The one way a bookie
    repairs its own copies: a missing one (this module), a corrupt one (the scrubber)."""
    response: Any = await read_copy(ctx, ledger_id, entry_id, peers)
    if response is None:
        return False
    record = pack_entry_record(response.entry_lac, payload_digest(response.payload),
                               response.digest, response.payload)  # fmt: skip
    done = asyncio.get_running_loop().create_future()
    handler.store_copy(ledger_id, entry_id, record, lambda exc: _settle(done, exc))
    await done
    return True


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
