"""The metadata store on a real etcd (v3 API over gRPC, through aetcd). Layout: docs/metadata.md.

Theory of operation
-------------------
Every value is JSON, so ``etcdctl get --prefix ROOT`` shows readable metadata. A value's version
is its etcd ``mod_revision``; a compare-and-swap is a transaction comparing it. Ledger ids are
random 63-bit numbers claimed with a create-if-absent transaction that also records the
creator token, so a retried create (the client never saw the answer) finds its ledger instead
of making a second one.

Every call runs under ``call_timeout_s``. Reads and conditional writes are retried with jittered
backoff when etcd is unreachable (a conditional write is safe to retry: if the first attempt
landed, the retry conflicts and the caller sees the value it wrote). When every endpoint fails,
:class:`MetadataUnavailableError` names them. A bookie registration is a key under a lease
refreshed by an owned keepalive task; if the lease is lost (etcd restarted, a long pause), the
task registers again under a new lease. A ledger watch resumes from the last revision seen + 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
from aetcd import rpc

from ..config import MetadataConfig
from ..errors import MetadataUnavailableError, MetadataVersionError, NoSuchLedgerError
from .model import LedgerMetadata, Versioned
from .store import BookieInfo

log = logging.getLogger(__name__)
T = TypeVar("T")
_UNAVAILABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    TimeoutError,
    OSError,
)


class EtcdMetadataStore:
    """See the module docstring. Create with :meth:`connect`."""

    def __init__(self, endpoints: list[str], root: str, config: MetadataConfig) -> None:
        self.endpoints = endpoints
        self.root = root.rstrip("/")
        self.config = config
        self.rng = random.Random()
        self._endpoint_index = 0
        self._client: aetcd.Client | None = None
        self._registrations: list[EtcdRegistration] = []

    @classmethod
    async def connect(
        cls, endpoints: list[str], root: str, config: MetadataConfig
    ) -> EtcdMetadataStore:
        """Connect and check that etcd answers.

        Raises:
            MetadataUnavailableError: no endpoint answered within the timeouts.
        """
        store = cls(endpoints, root, config)
        await store._call(lambda c: c.get(store._key("instanceid")))
        return store

    # --- plumbing -------------------------------------------------------------------------

    def _key(self, *parts: str) -> bytes:
        return "/".join((self.root, *parts)).encode()

    def _ledger_key(self, ledger_id: int) -> bytes:
        return self._key("ledgers", f"{ledger_id:020d}")

    def _new_client(self) -> aetcd.Client:
        host, _, port = self.endpoints[self._endpoint_index].rpartition(":")
        timeout = max(1, round(self.config.call_timeout_s))
        return aetcd.Client(host=host, port=int(port), timeout=timeout)

    async def _call(self, op: Callable[[aetcd.Client], Awaitable[T]], retry: bool = True) -> T:
        attempts = self.config.retries_max if retry else 1
        delay = self.config.retry_backoff_s
        last: BaseException | None = None
        for attempt in range(attempts):
            if self._client is None:
                self._client = self._new_client()
            try:
                async with asyncio.timeout(self.config.call_timeout_s):
                    return await op(self._client)
            except _UNAVAILABLE as exc:
                last = exc
                await self._drop_client()
                self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
                if attempt + 1 < attempts:
                    await asyncio.sleep(delay * (0.5 + self.rng.random()))
                    delay = min(delay * 2, self.config.retry_backoff_max_s)
        raise MetadataUnavailableError(
            f"etcd at {','.join(self.endpoints)} is unreachable: {type(last).__name__}: {last}"
        )

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception:
                pass

    async def close(self) -> None:
        """Stop keepalives (registrations stay until their leases expire) and disconnect."""
        for reg in list(self._registrations):
            reg.abandon()
        await self._drop_client()

    # --- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned:
        token = make(1).creator_token
        creator_key = self._key("creators", token) if token else None
        for _ in range(16):
            ledger_id = self.rng.randrange(1, 1 << 63)
            metadata = make(ledger_id)
            key = self._ledger_key(ledger_id)

            async def txn(c: aetcd.Client, key: bytes = key, md: LedgerMetadata = metadata):
                t = c.transactions
                compare = [t.create(key) == 0]
                success = [t.put(key, md.to_json_bytes())]
                if creator_key is not None:
                    compare.append(t.create(creator_key) == 0)
                    success.append(t.put(creator_key, str(md.ledger_id).encode()))
                return await c.transaction(compare=compare, success=success, failure=[])

            succeeded, _ = await self._call(txn)
            if succeeded:
                return await self.read_ledger(ledger_id)
            if creator_key is not None:
                existing = await self._call(lambda c: c.get(creator_key))
                if existing is not None:  # a retry of a create that already happened
                    return await self.read_ledger(int(existing.value))
        raise MetadataUnavailableError("could not find a free ledger id in 16 attempts")

    async def read_ledger(self, ledger_id: int) -> Versioned:
        found = await self._call(lambda c: c.get(self._ledger_key(ledger_id)))
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision)

    async def _current(self, key: bytes, decode: Callable[[bytes], Any]) -> Versioned | None:
        found = await self._call(lambda c: c.get(key))
        return None if found is None else Versioned(decode(found.value), found.mod_revision)

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned:
        key = self._ledger_key(ledger_id)

        async def txn(c: aetcd.Client):
            t = c.transactions
            return await c.transaction(
                compare=[t.mod(key) == expected_version],
                success=[t.put(key, metadata.to_json_bytes())],
                failure=[],
            )

        succeeded, _ = await self._call(txn)
        current = await self._current(key, LedgerMetadata.from_json_bytes)
        if not succeeded:
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale", current=current
            )
        assert current is not None
        return current

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        key = self._ledger_key(ledger_id)

        async def txn(c: aetcd.Client):
            t = c.transactions
            compare = [t.create(key) > 0]
            if expected_version is not None:
                compare.append(t.mod(key) == expected_version)
            return await c.transaction(compare=compare, success=[t.delete(key)], failure=[])

        succeeded, _ = await self._call(txn)
        if not succeeded:
            current = await self._current(key, LedgerMetadata.from_json_bytes)
            if current is None:
                raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
            raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)

    async def list_ledgers(self) -> AsyncIterator[int]:
        prefix = self._key("ledgers", "")
        start = prefix
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        while True:
            page = await self._call(lambda c, s=start: self._keys_page(c, s, end))
            keys = [kv.key for kv in page.kvs]
            for key in keys:
                yield int(key[len(prefix) :])
            if not page.more or not keys:
                return
            start = keys[-1] + b"\x00"

    async def _keys_page(self, c: aetcd.Client, start: bytes, end: bytes) -> Any:
        # aetcd's get_range has no limit; the raw Range RPC does (keys only: cheap pages).
        await c.connect()
        request = rpc.RangeRequest(
            key=start, range_end=end, limit=self.config.list_page_max, keys_only=True
        )
        return await c.kvstub.Range(request, timeout=c._timeout, metadata=c.metadata)

    async def watch_ledger(self, ledger_id: int) -> AsyncIterator[Versioned | None]:
        key = self._ledger_key(ledger_id)
        current = await self._current(key, LedgerMetadata.from_json_bytes)
        revision = current.version if current else 0
        while True:
            try:
                assert self._client is not None
                watch = await self._client.watch(key, start_revision=revision + 1)
                async for event in watch:
                    revision = event.kv.mod_revision
                    if event.kind == "DELETE":
                        yield None
                        return
                    value = LedgerMetadata.from_json_bytes(event.kv.value)
                    yield Versioned(value, event.kv.mod_revision)
            except _UNAVAILABLE as exc:
                log.warning("watch of ledger %d broke (%s); resuming", ledger_id, exc)
                await self._drop_client()
                await self._call(lambda c: c.get(key))  # reconnect, with backoff

    # --- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self, bookie_id: str, address: str, rack: str | None, read_only: bool
    ) -> EtcdRegistration:
        reg = EtcdRegistration(self, BookieInfo(bookie_id, address, rack, read_only))
        await reg.start()
        self._registrations.append(reg)
        return reg

    async def list_bookies(self) -> dict[str, BookieInfo]:
        found = await self._call(lambda c: c.get_prefix(self._key("bookies", "")))
        infos = [BookieInfo(**json.loads(kv.value)) for kv in found]
        return {info.bookie_id: info for info in sorted(infos)}

    # --- cookies and the instance id ------------------------------------------------------

    async def get_cookie(self, bookie_id: str) -> Versioned | None:
        return await self._current(self._key("cookies", bookie_id), bytes)

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned:
        key = self._key("cookies", bookie_id)

        async def txn(c: aetcd.Client):
            t = c.transactions
            check = (
                t.create(key) == 0 if expected_version is None else t.mod(key) == expected_version
            )
            return await c.transaction(compare=[check], success=[t.put(key, data)], failure=[])

        succeeded, _ = await self._call(txn)
        current = await self._current(key, bytes)
        if not succeeded:
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)
        assert current is not None
        return current

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        key = self._key("cookies", bookie_id)

        async def txn(c: aetcd.Client):
            t = c.transactions
            compare = [t.mod(key) == expected_version]
            return await c.transaction(compare=compare, success=[t.delete(key)], failure=[])

        succeeded, _ = await self._call(txn)
        if not succeeded:
            current = await self._current(key, bytes)
            raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)

    async def init_cluster(self) -> str:
        key = self._key("instanceid")
        new_id = str(uuid.uuid4())

        async def txn(c: aetcd.Client):
            t = c.transactions
            return await c.transaction(
                compare=[t.create(key) == 0], success=[t.put(key, new_id.encode())], failure=[]
            )

        await self._call(txn)
        instance_id = await self.get_instance_id()
        assert instance_id is not None
        return instance_id

    async def get_instance_id(self) -> str | None:
        found = await self._call(lambda c: c.get(self._key("instanceid")))
        return None if found is None else found.value.decode()


class EtcdRegistration:
    """A bookie's key under a lease, with an owned keepalive task (see the module docstring)."""

    def __init__(self, store: EtcdMetadataStore, info: BookieInfo) -> None:
        self.store = store
        self.info = info
        self._lease_id: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._register()
        self._task = asyncio.get_running_loop().create_task(self._keepalive())

    async def _register(self) -> None:
        store, info = self.store, self.info
        lease = await store._call(lambda c: c.lease(store.config.lease_ttl_s))
        self._lease_id = lease.id
        value = json.dumps(info._asdict(), sort_keys=True).encode()
        key = store._key("bookies", info.bookie_id)
        await store._call(lambda c: c.put(key, value, lease=lease.id))

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.store.config.keepalive_interval_s)
            try:
                reply = await self.store._call(lambda c: c.refresh_lease(self._lease_id))
                if reply is None or reply.TTL <= 0:
                    log.warning(
                        "lease of bookie %s was lost; registering again", self.info.bookie_id
                    )
                    await self._register()
            except MetadataUnavailableError as exc:
                log.warning("bookie %s keepalive failed: %s", self.info.bookie_id, exc)

    async def update(self, *, read_only: bool) -> None:
        """Change the registered read-only state."""
        self.info = self.info._replace(read_only=read_only)
        value = json.dumps(self.info._asdict(), sort_keys=True).encode()
        key = self.store._key("bookies", self.info.bookie_id)
        await self.store._call(lambda c: c.put(key, value, lease=self._lease_id))

    def abandon(self) -> None:
        """Stop the keepalive; the key goes when the lease expires."""
        if self._task is not None:
            self._task.cancel()
        if self in self.store._registrations:
            self.store._registrations.remove(self)

    async def unregister(self) -> None:
        """Remove the registration now (clean shutdown)."""
        self.abandon()
        if self._lease_id is not None:
            lease_id = self._lease_id
            await self.store._call(lambda c: c.revoke_lease(lease_id))
