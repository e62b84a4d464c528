"""Keys in the in-process store: the same contract as on etcd (``etcd_keys.py``).

Theory of operation
-------------------
:class:`KeySpace` holds every key of a named memory store with its value, version (the store's
one revision counter, as etcd's mod_revision) and the lease it is tied to, plus the watchers of
single keys and of prefixes. Watch queues are bounded (``watch_queue_max``) and carry states:
a watcher that falls behind loses older states, never the newest.

A key put under a lease is listed in the lease; when the lease ends (revoked, or expired on the
event loop's clock) the store deletes those keys, as etcd does. Overwriting a key moves it to
the new lease (or to none).

:class:`MemoryKeys` is a mixin of :class:`~bookkeeper_aio.metadata.memory.MemoryMetadataStore`
and goes through the store's injected faults like every other call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import LeaseNotFoundError, MetadataVersionError
from .lease import Lease
from .model import Versioned
from .store_shared import check_key, check_value, offer

if TYPE_CHECKING:
    from collections import Counter

    from ..config import MetadataConfig
    from .memory import MemoryState


@dataclass
class KeySpace:
    """Every key of a memory store and who watches them (see the module docstring)."""

    values: dict[str, tuple[bytes, int, int]] = field(default_factory=dict)  # value, ver, lease
    watchers: list[tuple[str, bool, asyncio.Queue]] = field(default_factory=list)

    def get(self, key: str) -> Versioned[bytes] | None:
        found = self.values.get(key)
        return None if found is None else Versioned(found[0], found[1])

    def lease_of(self, key: str) -> int:
        found = self.values.get(key)
        return 0 if found is None else found[2]

    def items(self, prefix: str) -> list[tuple[str, Versioned[bytes]]]:
        return [
            (k, Versioned(v, version))
            for k, (v, version, _) in sorted(self.values.items())
            if k.startswith(prefix)
        ]

    def set(self, key: str, value: bytes, version: int, lease_id: int) -> Versioned[bytes]:
        self.values[key] = (value, version, lease_id)
        self._notify(key)
        return Versioned(value, version)

    def delete(self, key: str) -> bool:
        if self.values.pop(key, None) is None:
            return False
        self._notify(key)
        return True

    def _notify(self, key: str) -> None:
        for watched, exact, queue in self.watchers:
            if exact and watched == key:
                offer(queue, self.get(key))
            elif not exact and key.startswith(watched):
                offer(queue, dict(self.items(watched)))


class MemoryLease(Lease):
    """A lease of the memory store, expiring on the event loop's clock."""

    def __init__(self, store: MemoryKeys, lease_id: int, ttl_s: int, interval_s: float):
        super().__init__(lease_id, ttl_s, interval_s)
        self.store = store

    async def _refresh(self) -> bool:
        await self.store._before()
        return self.store.state.refresh(self.lease_id)

    async def _revoke(self) -> None:
        await self.store._before()
        self.store.state.revoke(self.lease_id)


class MemoryKeys:
    """The key methods of the memory store (see the module docstring)."""

    state: MemoryState
    config: MetadataConfig
    counters: Counter[str]
    leases: set[Lease]  # granted by this store and alive: abandoned when it closes

    async def _before(self) -> None:
        raise NotImplementedError

    def _after(self) -> None:
        raise NotImplementedError

    async def get(self, key: str) -> Versioned[bytes] | None:
        await self._before()
        check_key(key)
        return self.state.keys.get(key)

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        lease: Lease | None = None,
    ) -> Versioned[bytes]:
        await self._before()
        check_value(key, value, self.config)
        keys, leases = self.state.keys, self.state.leases
        current = keys.get(key)
        if expected_version is not None and (
            (current.version if current is not None else 0) != expected_version
        ):
            self.counters["conflicts"] += 1
            raise MetadataVersionError(
                f"{key}: version {expected_version} is stale", current=current
            )
        lease_id = 0 if lease is None else lease.lease_id
        if lease_id and lease_id not in leases:
            raise LeaseNotFoundError(f"write {key}: lease {lease_id:x} not found")
        old = leases.get(keys.lease_of(key))
        if old is not None:
            old.keys.discard(key)
        if lease_id:
            leases[lease_id].keys.add(key)
        versioned = keys.set(key, bytes(value), self.state.bump(), lease_id)
        self._after()
        return versioned

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        await self._before()
        check_key(key)
        current = self.state.keys.get(key)
        if expected_version is not None and (
            current is None or current.version != expected_version
        ):
            self.counters["conflicts"] += 1
            raise MetadataVersionError(
                f"{key}: version {expected_version} is stale", current=current
            )
        existed = self._delete(key)
        self._after()
        return existed

    def _delete(self, key: str) -> bool:
        old = self.state.leases.get(self.state.keys.lease_of(key))
        if old is not None:
            old.keys.discard(key)
        if key not in self.state.keys.values:
            return False
        self.state.bump()
        return self.state.keys.delete(key)

    async def list_prefix(self, prefix: str) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        check_key(prefix, prefix=True)
        cursor = ""
        while True:
            await self._before()
            items = self.state.keys.items(prefix)
            page = [kv for kv in items if kv[0] > cursor][: self.config.list_page_max]
            for item in page:
                yield item
            if len(page) < self.config.list_page_max:
                return
            cursor = page[-1][0]

    async def delete_prefix(self, prefix: str) -> int:
        await self._before()
        check_key(prefix, prefix=True)
        doomed = [k for k, _ in self.state.keys.items(prefix)]
        for key in doomed:
            self._delete(key)
        self._after()
        return len(doomed)

    async def watch(self, key: str) -> AsyncGenerator[Versioned[bytes] | None, None]:
        await self._before()
        check_key(key)
        async for state in self._watch(key, True, self.state.keys.get(key)):
            yield state

    async def watch_prefix(self, prefix: str) -> AsyncGenerator[dict[str, Versioned[bytes]], None]:
        await self._before()
        check_key(prefix, prefix=True)
        async for snapshot in self._watch(prefix, False, dict(self.state.keys.items(prefix))):
            yield snapshot

    async def _watch(self, watched: str, exact: bool, first: Any) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue(self.config.watch_queue_max)
        entry = (watched, exact, queue)
        self.state.keys.watchers.append(entry)  # registered before the first state is read
        try:
            offer(queue, first)
            while True:
                yield await queue.get()
        finally:
            self.state.keys.watchers.remove(entry)

    async def grant_lease(self, ttl_s: int) -> Lease:
        await self._before()
        lease_id = self.state.grant(None, ttl_s)
        self._after()
        lease = MemoryLease(self, lease_id, ttl_s, self.config.keepalive_interval_s)
        lease.start(self.leases)
        return lease
