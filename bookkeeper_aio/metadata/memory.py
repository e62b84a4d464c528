"""An in-process metadata store with etcd's semantics, for the simulator and unit tests.

Theory of operation
-------------------
Values carry versions from one revision counter, as etcd's mod_revision does, so a CAS here
conflicts exactly when it would there. Leases expire on the event loop's clock (no wall clock,
no threads), so a virtual-time loop runs this store deterministically: a registration whose
keepalive stops (the process "died") vanishes ``lease_ttl_s`` later. Stores opened with the same
``memory://NAME`` in one process share one state, so simulated bookies and clients agree.
Optional ``latency_s`` and ``failure_rate`` hooks (with an injected ``random.Random``) let a
simulator make the store slow or flaky.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ..config import MetadataConfig
from ..errors import MetadataUnavailableError, MetadataVersionError, NoSuchLedgerError
from .model import LedgerMetadata, Versioned
from .store import BookieInfo


@dataclass
class _State:
    revision: int = 0
    ledgers: dict[int, Versioned] = field(default_factory=dict)
    creators: dict[str, int] = field(default_factory=dict)
    bookies: dict[str, tuple[BookieInfo, float]] = field(default_factory=dict)  # info, expiry
    cookies: dict[str, Versioned] = field(default_factory=dict)
    instance_id: str | None = None
    watchers: dict[int, list[asyncio.Queue]] = field(default_factory=dict)

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision


_NAMED: dict[str, _State] = {}


class MemoryRegistration:
    """A bookie registration kept alive by an owned keepalive task."""

    def __init__(self, store: MemoryMetadataStore, info: BookieInfo) -> None:
        self.store = store
        self.info = info
        store._touch(info)
        self._task = asyncio.get_running_loop().create_task(self._keepalive())

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.store.config.keepalive_interval_s)
            self.store._touch(self.info)

    async def update(self, *, read_only: bool) -> None:
        self.info = self.info._replace(read_only=read_only)
        self.store._touch(self.info)

    def abandon(self) -> None:
        """Stop the keepalive without unregistering (a crashed process): the lease expires."""
        self._task.cancel()

    async def unregister(self) -> None:
        self.abandon()
        self.store.state.bookies.pop(self.info.bookie_id, None)


class MemoryMetadataStore:
    """See the module docstring."""

    def __init__(
        self,
        state: _State | None = None,
        config: MetadataConfig | None = None,
        *,
        rng: random.Random | None = None,
        latency_s: Callable[[], float] | None = None,
        failure_rate: float = 0.0,
    ) -> None:
        self.state = state or _State()
        self.config = config or MetadataConfig()
        self.rng = rng or random.Random()
        self.latency_s = latency_s
        self.failure_rate = failure_rate

    @classmethod
    def named(cls, name: str, config: MetadataConfig | None = None) -> MemoryMetadataStore:
        """A store sharing state with every other store of this name in the process."""
        return cls(_NAMED.setdefault(name, _State()), config)

    async def _call(self) -> None:
        """Simulated latency and failures (no-ops unless configured)."""
        if self.latency_s is not None:
            await asyncio.sleep(self.latency_s())
        if self.failure_rate and self.rng.random() < self.failure_rate:
            raise MetadataUnavailableError("memory store: injected failure")

    # --- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned:
        await self._call()
        probe = make(1)
        token = probe.creator_token
        if token and token in self.state.creators:
            return self.state.ledgers[self.state.creators[token]]
        ledger_id = self.rng.randrange(1, 1 << 63)
        while ledger_id in self.state.ledgers:
            ledger_id = self.rng.randrange(1, 1 << 63)
        versioned = Versioned(make(ledger_id), self.state.next_revision())
        self.state.ledgers[ledger_id] = versioned
        if token:
            self.state.creators[token] = ledger_id
        self._notify(ledger_id, versioned)
        return versioned

    async def read_ledger(self, ledger_id: int) -> Versioned:
        await self._call()
        found = self.state.ledgers.get(ledger_id)
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return found

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned:
        await self._call()
        current = self.state.ledgers.get(ledger_id)
        if current is None or current.version != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale", current=current
            )
        versioned = Versioned(metadata, self.state.next_revision())
        self.state.ledgers[ledger_id] = versioned
        self._notify(ledger_id, versioned)
        return versioned

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        await self._call()
        current = self.state.ledgers.get(ledger_id)
        if current is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        if expected_version is not None and current.version != expected_version:
            raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)
        del self.state.ledgers[ledger_id]
        self.state.next_revision()
        self._notify(ledger_id, None)

    async def list_ledgers(self) -> AsyncIterator[int]:
        await self._call()
        for ledger_id in sorted(self.state.ledgers):
            yield ledger_id

    async def watch_ledger(self, ledger_id: int) -> AsyncIterator[Versioned | None]:
        queue: asyncio.Queue[Versioned | None] = asyncio.Queue(self.config.watch_queue_max)
        self.state.watchers.setdefault(ledger_id, []).append(queue)
        try:
            while True:
                value = await queue.get()
                yield value
                if value is None:
                    return
        finally:
            self.state.watchers[ledger_id].remove(queue)

    def _notify(self, ledger_id: int, value: Versioned | None) -> None:
        for queue in self.state.watchers.get(ledger_id, ()):
            if queue.full():  # a slow watcher only needs the latest value
                queue.get_nowait()
            queue.put_nowait(value)

    # --- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self, bookie_id: str, address: str, rack: str | None, read_only: bool
    ) -> MemoryRegistration:
        await self._call()
        return MemoryRegistration(self, BookieInfo(bookie_id, address, rack, read_only))

    def _touch(self, info: BookieInfo) -> None:
        expiry = asyncio.get_running_loop().time() + self.config.lease_ttl_s
        self.state.bookies[info.bookie_id] = (info, expiry)

    async def list_bookies(self) -> dict[str, BookieInfo]:
        await self._call()
        now = asyncio.get_running_loop().time()
        for bookie_id, (_, expiry) in list(self.state.bookies.items()):
            if expiry <= now:
                del self.state.bookies[bookie_id]
        return {b: info for b, (info, _) in sorted(self.state.bookies.items())}

    # --- cookies and the instance id ------------------------------------------------------

    async def get_cookie(self, bookie_id: str) -> Versioned | None:
        await self._call()
        return self.state.cookies.get(bookie_id)

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned:
        await self._call()
        current = self.state.cookies.get(bookie_id)
        if (current.version if current else None) != expected_version:
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)
        versioned = Versioned(data, self.state.next_revision())
        self.state.cookies[bookie_id] = versioned
        return versioned

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        await self._call()
        current = self.state.cookies.get(bookie_id)
        if current is None or current.version != expected_version:
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)
        del self.state.cookies[bookie_id]

    async def init_cluster(self) -> str:
        await self._call()
        if self.state.instance_id is None:
            self.state.instance_id = str(uuid.UUID(int=self.rng.getrandbits(128)))
        return self.state.instance_id

    async def get_instance_id(self) -> str | None:
        await self._call()
        return self.state.instance_id

    async def close(self) -> None:
        """Nothing to release (the shared state outlives the store object)."""
