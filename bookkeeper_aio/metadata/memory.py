"""An in-process metadata store with etcd's semantics, for the simulator and unit tests.

Theory of operation
-------------------
One revision counter versions every write, as etcd's mod_revision does, so a CAS here
conflicts exactly when it would there. Values are stored as the same JSON the etcd store
writes and decoded on the way out, so anything that would not survive etcd fails here too.

Leases expire on the event loop's clock (``loop.call_at``; no wall clock, no threads), so a
virtual-time loop runs this store deterministically: a registration whose keepalive stops
(the process "died") vanishes ``lease_ttl_s`` later and bookie watchers see it go. Watches are
bounded queues (``watch_queue_max``); a watcher that falls that far behind loses the oldest
items, never the latest one.

Stores opened with the same ``memory://NAME`` in one process share one :class:`MemoryState`
(the one module-level registry, :data:`_NAMED`), so simulated bookies and clients agree.
:class:`MemoryFaults` makes the store slow or flaky from an injected ``random.Random``:
latency, failures before an operation, and lost replies after it (the operation happened but
the caller sees MetadataUnavailableError, as with a real network).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import MetadataConfig
from ..errors import MetadataUnavailableError, MetadataVersionError
from .lease import Lease
from .memory_keys import KeySpace, MemoryKeys
from .model import MAX_LEDGER_ID, LedgerMetadata, Versioned
from .registration import BookieInfo, BookieRegistration
from .store_shared import (
    check_bookie_id,
    check_cookie,
    check_value,
    encode_ledger,
    new_instance_id,
    no_such_ledger,
    offer,
    tombstone_key,
    with_creator_token,
)

_NAMED: dict[str, MemoryState] = {}


@dataclass
class MemoryFaults:
    """Injected trouble: each call sleeps up to ``latency_s_max``, then fails with
    ``failure_rate`` before doing anything, or with ``lost_reply_rate`` after doing it."""

    rng: random.Random
    latency_s_max: float = 0.0
    failure_rate: float = 0.0
    lost_reply_rate: float = 0.0


@dataclass
class _Lease:
    bookie_id: str | None  # a registration's lease, or one granted by grant_lease
    ttl_s: float
    handle: asyncio.TimerHandle
    keys: set[str] = field(default_factory=set)  # keys put under it: deleted when it ends


@dataclass
class MemoryState:
    """Everything a named memory store holds (shared by stores of the same name)."""

    revision: int = 0
    ledgers: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # JSON, version
    creators: dict[str, int] = field(default_factory=dict)  # creator token -> ledger id
    bookies: dict[str, tuple[BookieInfo, int]] = field(default_factory=dict)  # info, lease
    leases: dict[int, _Lease] = field(default_factory=dict)
    cookies: dict[str, Versioned] = field(default_factory=dict)
    instance_id: str | None = None
    ledger_watchers: dict[int, list[asyncio.Queue]] = field(default_factory=dict)
    bookie_watchers: list[asyncio.Queue] = field(default_factory=list)
    next_lease_id: int = 1
    keys: KeySpace = field(default_factory=KeySpace)

    def bump(self) -> int:
        self.revision += 1
        return self.revision

    # --- leases (what etcd's lessor does) -------------------------------------------------

    def grant(self, bookie_id: str | None, ttl_s: float) -> int:
        lease_id, self.next_lease_id = self.next_lease_id, self.next_lease_id + 1
        self.leases[lease_id] = _Lease(bookie_id, ttl_s, self._schedule(lease_id, ttl_s))
        return lease_id

    def _schedule(self, lease_id: int, ttl_s: float) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_at(loop.time() + ttl_s, self.revoke, lease_id)

    def refresh(self, lease_id: int) -> bool:
        lease = self.leases.get(lease_id)
        if lease is None:
            return False
        lease.handle.cancel()
        lease.handle = self._schedule(lease_id, lease.ttl_s)
        return True

    def revoke(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        lease.handle.cancel()
        for key in sorted(lease.keys):
            self.bump()
            self.keys.delete(key)
        bookie_id = lease.bookie_id
        found = self.bookies.get(bookie_id) if bookie_id else None
        if bookie_id and found is not None and found[1] == lease_id:
            del self.bookies[bookie_id]
            self.bump()
            self.notify_bookies()

    def put_bookie(self, info: BookieInfo, lease_id: int) -> bool:
        if lease_id not in self.leases:
            return False
        self.bookies[info.bookie_id] = (info, lease_id)
        self.bump()
        self.notify_bookies()
        return True

    # --- watches --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, BookieInfo]:
        return {b: info for b, (info, _) in sorted(self.bookies.items())}

    def notify_bookies(self) -> None:
        snapshot = self.snapshot()
        for queue in self.bookie_watchers:
            offer(queue, snapshot)

    def notify_ledger(self, ledger_id: int, value: Versioned | None) -> None:
        for queue in self.ledger_watchers.get(ledger_id, ()):
            offer(queue, value)


class MemoryRegistration(BookieRegistration):
    """A registration in a :class:`MemoryMetadataStore` (see ``registration.py``)."""

    def __init__(self, store: MemoryMetadataStore, info: BookieInfo) -> None:
        super().__init__(info, store.config.keepalive_interval_s)
        self.store = store
        self.lease_id = 0

    async def _register(self) -> None:
        await self.store._before()
        state = self.store.state
        self.lease_id = state.grant(self.info.bookie_id, self.store.config.lease_ttl_s)
        state.put_bookie(self.info, self.lease_id)
        self.store._after()

    async def _refresh(self) -> bool:
        await self.store._before()
        return self.store.state.refresh(self.lease_id)

    async def _publish(self) -> None:
        await self.store._before()
        if not self.store.state.put_bookie(self.info, self.lease_id):
            self.reregistrations += 1
            await self._register()

    async def _revoke(self) -> None:
        await self.store._before()
        self.store.state.revoke(self.lease_id)

    def _detach(self) -> None:
        if self in self.store.registrations:
            self.store.registrations.remove(self)


class MemoryMetadataStore(MemoryKeys):
    """See the module docstring and ``store.MetadataStore`` for each method's contract.
    The generic key methods (``get``, ``put``, ``watch``, leases, ...) are in
    ``memory_keys.py``."""

    def __init__(
        self,
        state: MemoryState | None = None,
        config: MetadataConfig | None = None,
        *,
        rng: random.Random | None = None,
        faults: MemoryFaults | None = None,
    ) -> None:
        self.state = state or MemoryState()
        self.config = config or MetadataConfig()
        self.rng = rng or random.Random()
        self.faults = faults
        self.registrations: list[MemoryRegistration] = []
        self.leases: set[Lease] = set()
        self.counters: Counter[str] = Counter()

    @classmethod
    def named(
        cls, name: str, config: MetadataConfig | None = None, **kwargs: Any
    ) -> MemoryMetadataStore:
        """A store sharing state with every other store of this name in the process."""
        return cls(_NAMED.setdefault(name, MemoryState()), config, **kwargs)

    @staticmethod
    def forget(name: str) -> None:
        """Drop a named state (tests and simulations that reuse names)."""
        _NAMED.pop(name, None)

    async def _before(self) -> None:
        """Injected latency and failures (no-ops without ``faults``)."""
        self.counters["calls"] += 1
        faults = self.faults
        if faults is None:
            return
        if faults.latency_s_max:
            await asyncio.sleep(faults.rng.uniform(0, faults.latency_s_max))
        if faults.failure_rate and faults.rng.random() < faults.failure_rate:
            self.counters["injected_failures"] += 1
            raise MetadataUnavailableError("memory store: injected failure")

    def _after(self) -> None:
        faults = self.faults
        if faults and faults.lost_reply_rate and faults.rng.random() < faults.lost_reply_rate:
            self.counters["injected_lost_replies"] += 1
            raise MetadataUnavailableError("memory store: injected lost reply (it happened)")

    def statistics(self) -> dict[str, int]:
        return {
            **self.counters,
            "revision": self.state.revision,
            "ledgers": len(self.state.ledgers),
            "keys": len(self.state.keys.values),
            "bookies": len(self.state.bookies),
            "registrations": len(self.registrations),
        }

    # --- ledgers --------------------------------------------------------------------------

    def _stored(self, ledger_id: int) -> Versioned | None:
        found = self.state.ledgers.get(ledger_id)
        if found is None:
            return None
        return Versioned(LedgerMetadata.from_json_bytes(found[0]), found[1])

    def _store(self, ledger_id: int, data: bytes) -> Versioned:
        version = self.state.bump()
        self.state.ledgers[ledger_id] = (data, version)
        versioned = Versioned(LedgerMetadata.from_json_bytes(data), version)
        self.state.notify_ledger(ledger_id, versioned)
        return versioned

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned:
        await self._before()
        make, token = with_creator_token(make, self.rng)
        existing = self.state.creators.get(token)
        if existing is not None:
            self._after()
            return await self.read_ledger(existing)
        ledger_id = self.rng.randint(1, MAX_LEDGER_ID)
        # A tombstoned id is never reused: its bookies' collectors may delete its data.
        while ledger_id in self.state.ledgers or self.state.keys.get(tombstone_key(ledger_id)):
            ledger_id = self.rng.randint(1, MAX_LEDGER_ID)
        versioned = self._store(ledger_id, encode_ledger(make(ledger_id), self.config))
        self.state.creators[token] = ledger_id
        self._after()
        return versioned

    async def restore_ledger(self, metadata: LedgerMetadata) -> Versioned | None:
        await self._before()
        data = encode_ledger(metadata, self.config)
        if metadata.ledger_id in self.state.ledgers:
            self._after()
            return None
        versioned = self._store(metadata.ledger_id, data)
        self._after()
        return versioned

    async def read_ledger(self, ledger_id: int) -> Versioned:
        await self._before()
        found = self._stored(ledger_id)
        if found is None:
            raise no_such_ledger(ledger_id)
        return found

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned:
        await self._before()
        data = encode_ledger(metadata, self.config)
        current = self._stored(ledger_id)
        if current is None:
            raise no_such_ledger(ledger_id)
        if current.version != expected_version:
            self.counters["conflicts"] += 1
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale", current=current
            )
        versioned = self._store(ledger_id, data)
        self._after()
        return versioned

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        await self._before()
        current = self._stored(ledger_id)
        if current is None:
            raise no_such_ledger(ledger_id)
        if expected_version is not None and current.version != expected_version:
            self.counters["conflicts"] += 1
            raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)
        del self.state.ledgers[ledger_id]
        if self.state.creators.get(current.value.creator_token) == ledger_id:
            del self.state.creators[current.value.creator_token]
        self.state.bump()
        self.state.notify_ledger(ledger_id, None)
        self._after()

    async def tombstone_ledger(
        self, ledger_id: int, expected_version: int, tombstone: bytes
    ) -> Versioned[bytes]:
        await self._before()
        check_value(tombstone_key(ledger_id), tombstone, self.config)
        current = self._stored(ledger_id)
        if current is None:
            raise no_such_ledger(ledger_id)
        if current.version != expected_version:
            self.counters["conflicts"] += 1
            raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)
        del self.state.ledgers[ledger_id]
        if self.state.creators.get(current.value.creator_token) == ledger_id:
            del self.state.creators[current.value.creator_token]
        key = tombstone_key(ledger_id)
        self._delete(key)  # a stale one (removed later by its TTL) never stays under a lease
        stored = self.state.keys.set(key, bytes(tombstone), self.state.bump(), 0)
        self.state.notify_ledger(ledger_id, None)
        self._after()
        return stored

    async def list_ledgers(self) -> AsyncIterator[int]:
        cursor = 0
        while True:
            await self._before()
            page = sorted(i for i in self.state.ledgers if i > cursor)[: self.config.list_page_max]
            for ledger_id in page:
                yield ledger_id
            if len(page) < self.config.list_page_max:
                return
            cursor = page[-1]

    async def watch_ledger(
        self, ledger_id: int, since_version: int = 0
    ) -> AsyncGenerator[Versioned | None, None]:
        await self._before()
        queue: asyncio.Queue[Versioned | None] = asyncio.Queue(self.config.watch_queue_max)
        watchers = self.state.ledger_watchers.setdefault(ledger_id, [])
        watchers.append(queue)  # registered before reading: nothing falls in between
        try:
            current = self._stored(ledger_id)
            if current is None:
                raise no_such_ledger(ledger_id)
            offer(queue, current)
            while True:
                value = await queue.get()
                if value is None:
                    yield None
                    return
                if value.version > since_version:
                    since_version = value.version
                    yield value
        finally:
            watchers.remove(queue)
            if not watchers:
                del self.state.ledger_watchers[ledger_id]

    # --- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self,
        bookie_id: str,
        address: str,
        rack: str | None,
        read_only: bool,
        incarnation: str = "",
    ) -> MemoryRegistration:
        check_bookie_id(bookie_id)
        registration = MemoryRegistration(
            self, BookieInfo(bookie_id, address, rack, read_only, incarnation)
        )
        await registration.start()
        self.registrations.append(registration)
        return registration

    async def list_bookies(self) -> dict[str, BookieInfo]:
        await self._before()
        return self.state.snapshot()

    async def watch_bookies(self) -> AsyncGenerator[dict[str, BookieInfo], None]:
        await self._before()
        queue: asyncio.Queue[dict[str, BookieInfo]] = asyncio.Queue(self.config.watch_queue_max)
        self.state.bookie_watchers.append(queue)
        try:
            offer(queue, self.state.snapshot())
            while True:
                yield await queue.get()
        finally:
            self.state.bookie_watchers.remove(queue)

    # --- cookies and the instance id ------------------------------------------------------

    async def get_cookie(self, bookie_id: str) -> Versioned | None:
        await self._before()
        check_bookie_id(bookie_id)
        return self.state.cookies.get(bookie_id)

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned:
        await self._before()
        check_cookie(bookie_id, data, self.config)
        current = self.state.cookies.get(bookie_id)
        if (current.version if current else None) != expected_version:
            self.counters["conflicts"] += 1
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)
        versioned = Versioned(bytes(data), self.state.bump())
        self.state.cookies[bookie_id] = versioned
        self._after()
        return versioned

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        await self._before()
        current = self.state.cookies.get(bookie_id)
        if current is None or current.version != expected_version:
            self.counters["conflicts"] += 1
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)
        del self.state.cookies[bookie_id]
        self.state.bump()
        self._after()

    async def init_cluster(self) -> str:
        await self._before()
        if self.state.instance_id is None:
            self.state.instance_id = new_instance_id(self.rng)
            self.state.bump()
        self._after()
        return self.state.instance_id

    async def get_instance_id(self) -> str | None:
        await self._before()
        return self.state.instance_id

    async def close(self) -> None:
        """Stop this store's keepalives (the shared state outlives the store object)."""
        for registration in list(self.registrations):
            registration.abandon()
        for lease in list(self.leases):
            lease.abandon()
