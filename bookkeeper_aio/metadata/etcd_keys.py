"""Keys on etcd: versioned values, compare-and-swap, prefixes, watches and leases.

Theory of operation
-------------------
A key ``K`` is the etcd key ``ROOT/K``; its version is the key's ``mod_revision``. A
conditional write is one transaction (``create==0`` for "absent", ``mod==V`` for "at V") whose
failure branch reads the key, so a lost race costs one round trip and carries the winner.

Retries follow the store's rule (``etcd_conn.py``): only where a lost reply can be recognized.
A conditional put whose retry conflicts but finds exactly the bytes it wrote landed on its
first attempt; a conditional delete whose retry finds the key gone did too; unconditional puts
and deletes are idempotent. Lease grants are retried (a lost grant has no keys and expires).

:class:`EtcdKeys` is a mixin of :class:`~bookkeeper_aio.metadata.etcd.EtcdMetadataStore`: it
needs the store's ``conn``, ``config``, ``_key`` and ``_txn``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Any

import aetcd
from aetcd import rpc
from aetcd import transactions as tx

from ..errors import MetadataVersionError
from .etcd_conn import EtcdConnection, LeaseNotFoundError, WatchCompactedError
from .lease import Lease
from .model import Versioned
from .store_shared import check_key, check_value

if TYPE_CHECKING:
    from ..config import MetadataConfig


def prefix_end(prefix: bytes) -> bytes:
    """The first etcd key after every key starting with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _versioned(kv: Any) -> Versioned[bytes]:
    return Versioned(bytes(kv.value), kv.mod_revision)


class EtcdLease(Lease):
    """A lease granted by etcd (see ``lease.py``)."""

    def __init__(self, conn: EtcdConnection, lease_id: int, ttl_s: int, interval_s: float):
        super().__init__(lease_id, ttl_s, interval_s)
        self.conn = conn

    async def _refresh(self) -> bool:
        lease_id = self.lease_id
        reply = await self.conn.call(lambda c: c.refresh_lease(lease_id), "lease keepalive")
        return reply is not None and reply.TTL > 0

    async def _revoke(self) -> None:
        lease_id = self.lease_id
        try:
            await self.conn.call(lambda c: c.revoke_lease(lease_id), "revoke lease")
        except LeaseNotFoundError:
            pass


class EtcdKeys:
    """The key methods of the etcd store (see the module docstring)."""

    conn: EtcdConnection
    config: MetadataConfig
    leases: set[Lease]  # granted by this store and alive: abandoned when it closes

    def _key(self, *parts: str) -> bytes:
        raise NotImplementedError

    async def _txn(self, what: str, compare: list, success: list, failure: list) -> tuple:
        raise NotImplementedError

    def _user_key(self, key: str, *, prefix: bool = False) -> bytes:
        check_key(key, prefix=prefix)
        return self._key(key)

    async def get(self, key: str) -> Versioned[bytes] | None:
        k = self._user_key(key)
        found = await self.conn.call(lambda c: c.get(k), f"read {key}")
        return None if found is None else _versioned(found)

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        lease: Lease | None = None,
    ) -> Versioned[bytes]:
        check_value(key, value, self.config)
        k, value = self._user_key(key), bytes(value)
        lease_id = lease.lease_id if lease is not None else None
        if expected_version is None:
            compare = []
        elif expected_version == 0:
            compare = [tx.Create(k) == 0]
        else:
            compare = [tx.Mod(k) == expected_version]
        ok, responses, attempts = await self._txn(
            f"write {key}", compare=compare, success=[tx.Put(k, value, lease=lease_id)],
            failure=[tx.Get(k)],
        )  # fmt: skip
        if ok:
            return Versioned(value, responses[0].response_put.header.revision)
        found = responses[0][0][1] if responses[0] else None
        current = None if found is None else _versioned(found)
        if attempts > 1 and current is not None and current.value == value:
            return current  # our first attempt landed; its reply was lost
        self.conn.counters["conflicts"] += 1
        raise MetadataVersionError(f"{key}: version {expected_version} is stale", current=current)

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        k = self._user_key(key)
        compare = [] if expected_version is None else [tx.Mod(k) == expected_version]
        ok, responses, attempts = await self._txn(
            f"delete {key}", compare=compare, success=[tx.Delete(k)], failure=[tx.Get(k)]
        )
        if ok:
            return responses[0].response_delete_range.deleted > 0
        found = responses[0][0][1] if responses[0] else None
        if found is None and attempts > 1:
            return True  # our first attempt deleted it; its reply was lost
        self.conn.counters["conflicts"] += 1
        current = None if found is None else _versioned(found)
        raise MetadataVersionError(f"{key}: version {expected_version} is stale", current=current)

    async def list_prefix(self, prefix: str) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        p = self._user_key(prefix, prefix=True)
        root_len = len(self._key(""))
        start, end = p, prefix_end(p)
        while True:
            page = await self.conn.call(
                partial(self._range_page, start=start, end=end), f"list {prefix}"
            )
            for kv in page.kvs:
                yield kv.key[root_len:].decode(), _versioned(kv)
            if not page.more or not page.kvs:
                return
            start = page.kvs[-1].key + b"\x00"

    async def _range_page(
        self, c: aetcd.Client, start: bytes, end: bytes, *, keys_only: bool = False
    ) -> Any:
        """One page of ``[start, end)`` (aetcd's get_range has no limit; the raw RPC does)."""
        await c.connect()
        request = rpc.RangeRequest(
            key=start, range_end=end, limit=self.config.list_page_max, keys_only=keys_only
        )
        return await c.kvstub.Range(request, timeout=c._timeout, metadata=c.metadata)

    async def delete_prefix(self, prefix: str) -> int:
        p = self._user_key(prefix, prefix=True)
        reply = await self.conn.call(lambda c: c.delete_prefix(p), f"delete {prefix}")
        return int(reply.deleted)

    async def watch(self, key: str) -> AsyncGenerator[Versioned[bytes] | None, None]:
        k = self._user_key(key)
        while True:  # once, plus once per compaction of the history it needs
            # One range read gives the value and the revision it was read at (also when the
            # key is absent), so the watch misses nothing in between.
            reply = await self.conn.call(lambda c: self._range_page(c, k, k + b"\x00"), key)
            yield _versioned(reply.kvs[0]) if reply.kvs else None
            try:
                events = self.conn.watch(k, None, reply.header.revision + 1)
                async with aclosing(events):
                    async for event in events:
                        yield None if event.kind == "DELETE" else _versioned(event.kv)
                return  # the store was closed
            except WatchCompactedError:
                self.conn.counters["watch_compacted"] += 1

    async def watch_prefix(self, prefix: str) -> AsyncGenerator[dict[str, Versioned[bytes]], None]:
        p = self._user_key(prefix, prefix=True)
        root_len = len(self._key(""))
        while True:  # once, plus once per compaction
            revision = await self._revision()
            snapshot = {k: v async for k, v in self.list_prefix(prefix)}
            # Keys written after the listing's pages are replayed by the watch (same values).
            yield dict(snapshot)
            try:
                events = self.conn.watch(p, prefix_end(p), revision + 1)
                async with aclosing(events):
                    async for event in events:
                        name = event.kv.key[root_len:].decode()
                        if event.kind == "DELETE":
                            snapshot.pop(name, None)
                        else:
                            snapshot[name] = _versioned(event.kv)
                        yield dict(sorted(snapshot.items()))
                return
            except WatchCompactedError:
                self.conn.counters["watch_compacted"] += 1

    async def _revision(self) -> int:
        """The store's current revision (a read of any key carries it in its header)."""
        k = self._key("instanceid")
        reply = await self.conn.call(
            lambda c: self._range_page(c, k, k + b"\x00"), "read the revision"
        )
        return int(reply.header.revision)

    async def grant_lease(self, ttl_s: int) -> Lease:
        grant = await self.conn.call(lambda c: c.lease(ttl_s), f"grant a lease of {ttl_s} s")
        lease = EtcdLease(self.conn, grant.id, ttl_s, self.config.keepalive_interval_s)
        lease.start(self.leases)
        return lease
