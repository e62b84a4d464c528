"""The metadata store on a real etcd (v3 API over gRPC, through aetcd). Layout: docs/metadata.md.

Theory of operation
-------------------
Every value is JSON, so ``etcdctl get --prefix ROOT`` shows readable metadata. A value's version
is its etcd ``mod_revision``; every compare-and-swap is one transaction whose failure branch
reads the current value, so a lost race costs one round trip and the caller gets the winner.

Ledger ids are random 63-bit numbers claimed with a create-if-absent transaction that also
records the creator token under ``ROOT/creators/``; a retried create (the first reply was
lost) finds that record and returns the ledger the first attempt made.

Retries (``etcd_conn.py``) are used only where the outcome of a lost reply can be recognized:
reads; creates (the creator token); a CAS write or cookie put whose retry conflicts but finds
exactly the value it wrote (its first attempt landed); a delete whose retry finds the key gone.
Lease grants are retried too: a lease granted by a lost attempt has no keys and expires.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from functools import partial
from typing import Any

import aetcd
from aetcd import transactions as tx

from ..config import MetadataConfig
from ..errors import MetadataUnavailableError, MetadataVersionError
from .etcd_conn import EtcdConnection, LeaseNotFoundError, WatchCompactedError
from .etcd_keys import EtcdKeys, prefix_end
from .lease import Lease
from .model import LedgerMetadata, Versioned, time_ordered_ledger_id
from .registration import BookieInfo, BookieRegistration
from .store_shared import (
    bookie_info_from_json,
    bookie_info_to_json,
    check_bookie_id,
    check_cookie,
    check_value,
    encode_ledger,
    new_instance_id,
    no_such_ledger,
    tombstone_key,
    with_creator_token,
)


def _put_revision(responses: list[Any]) -> int:
    """The revision a transaction's first put was written at (= the key's mod_revision)."""
    return responses[0].response_put.header.revision


def _got(responses: list[Any]) -> Any | None:
    """The KeyValue of a transaction's single-key get, or None if the key was absent."""
    found = responses[0]
    return found[0][1] if found else None


class EtcdMetadataStore(EtcdKeys):
    """See the module docstring and ``store.MetadataStore``. Create with :meth:`connect`.
    The generic key methods (``get``, ``put``, ``watch``, leases, ...) are in ``etcd_keys.py``."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        root: str,
        config: MetadataConfig,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        **security: Any,
    ) -> None:
        """``security``: ``tls``, ``username``, ``password`` (etcd_conn.EtcdConnection).
        ``clock``: wall-clock seconds, for new ledger ids (time-ordered)."""
        self.root = root.rstrip("/")
        self.config = config
        self.rng = rng or random.Random()
        self.clock = clock
        self.conn = EtcdConnection(tuple(endpoints), config, self.rng, **security)
        self.registrations: list[EtcdRegistration] = []
        self.leases: set[Lease] = set()

    @classmethod
    async def connect(
        cls,
        endpoints: tuple[str, ...],
        root: str,
        config: MetadataConfig,
        rng: random.Random | None = None,
        **security: Any,
    ) -> EtcdMetadataStore:
        """Connect and check that etcd answers (``security``: as the constructor's).

        Raises:
            MetadataUnavailableError: no endpoint answered within the timeouts, or etcd
                refused the credentials.
            ConfigError: a TLS file cannot be read.
        """
        store = cls(endpoints, root, config, rng, **security)
        try:
            await store.conn.call(lambda c: c.get(store._key("instanceid")), "connect")
        except BaseException:
            await store.conn.close()
            raise
        return store

    def _key(self, *parts: str) -> bytes:
        return "/".join((self.root, *parts)).encode()

    def _ledger_key(self, ledger_id: int) -> bytes:
        return self._key("ledgers", f"{ledger_id:020d}")

    async def _txn(self, what: str, compare: list, success: list, failure: list) -> tuple:
        """One transaction (retried); returns (succeeded, responses, attempts made)."""
        attempts = 0

        async def run(c: aetcd.Client) -> tuple[bool, list]:
            nonlocal attempts
            attempts += 1
            return await c.transaction(compare=compare, success=success, failure=failure)

        succeeded, responses = await self.conn.call(run, what)
        return succeeded, responses, attempts

    def statistics(self) -> dict[str, int]:
        return {**self.conn.counters, "registrations": len(self.registrations)}

    async def close(self) -> None:
        """Stop keepalives (registrations stay until their leases expire) and disconnect."""
        for registration in list(self.registrations):
            registration.abandon()
        for lease in list(self.leases):
            lease.abandon()
        await self.conn.close()

    # --- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned:
        make, token = with_creator_token(make, self.rng)
        creator_key = self._key("creators", token)
        for _ in range(self.config.create_attempts_max):
            ledger_id = time_ordered_ledger_id(int(self.clock() * 1000), self.rng)
            metadata = make(ledger_id)
            key, data = self._ledger_key(ledger_id), encode_ledger(metadata, self.config)
            tombstone = self._key(tombstone_key(ledger_id))
            ok, responses, _ = await self._txn(
                f"create ledger {ledger_id}",
                # A tombstoned id is never reused: its bookies' collectors may delete its data.
                compare=[
                    tx.Create(key) == 0,
                    tx.Create(creator_key) == 0,
                    tx.Create(tombstone) == 0,
                ],
                success=[tx.Put(key, data), tx.Put(creator_key, str(ledger_id).encode())],
                failure=[tx.Get(creator_key)],
            )
            if ok:
                return Versioned(metadata, _put_revision(responses))
            existing = _got(responses)
            if existing is not None:  # this token already created its ledger
                return await self.read_ledger(int(existing.value))
            self.conn.counters["ledger_id_collisions"] += 1
        raise MetadataUnavailableError(
            f"no free ledger id in {self.config.create_attempts_max} random draws"
        )

    async def restore_ledger(self, metadata: LedgerMetadata) -> Versioned | None:
        key, data = self._ledger_key(metadata.ledger_id), encode_ledger(metadata, self.config)
        ok, responses, attempts = await self._txn(
            f"restore ledger {metadata.ledger_id}",
            compare=[tx.Create(key) == 0],
            success=[tx.Put(key, data)],
            failure=[tx.Get(key)],
        )
        if ok:
            return Versioned(metadata, _put_revision(responses))
        found = _got(responses)
        if found is not None and attempts > 1 and found.value == data:
            return Versioned(metadata, found.mod_revision)  # our first attempt landed
        return None

    async def read_ledger(self, ledger_id: int) -> Versioned:
        key = self._ledger_key(ledger_id)
        found = await self.conn.call(lambda c: c.get(key), f"read ledger {ledger_id}")
        if found is None:
            raise no_such_ledger(ledger_id)
        return Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision)

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned:
        key, data = self._ledger_key(ledger_id), encode_ledger(metadata, self.config)
        ok, responses, attempts = await self._txn(
            f"write ledger {ledger_id}",
            compare=[tx.Mod(key) == expected_version],
            success=[tx.Put(key, data)],
            failure=[tx.Get(key)],
        )
        if ok:
            return Versioned(metadata, _put_revision(responses))
        found = _got(responses)
        if found is None:
            raise no_such_ledger(ledger_id)
        current = Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision)
        if attempts > 1 and current.value == metadata:
            return current  # our first attempt landed; its reply was lost
        self.conn.counters["conflicts"] += 1
        raise MetadataVersionError(
            f"ledger {ledger_id}: version {expected_version} is stale", current=current
        )

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        key = self._ledger_key(ledger_id)
        current = await self.read_ledger(ledger_id)
        ambiguous = False  # a reply was lost: the key may be gone by our own hand
        for _ in range(self.config.retries_max):
            if expected_version is not None and current.version != expected_version:
                self.conn.counters["conflicts"] += 1
                raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)
            creator_key = self._key("creators", current.value.creator_token)
            ok, responses, attempts = await self._txn(
                f"delete ledger {ledger_id}",
                compare=[tx.Mod(key) == current.version],
                success=[tx.Delete(key), tx.Delete(creator_key)],
                failure=[tx.Get(key)],
            )
            ambiguous = ambiguous or attempts > 1
            if ok:
                return
            found = _got(responses)
            if found is None:
                if ambiguous:
                    return
                raise no_such_ledger(ledger_id)
            current = Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision)
        raise MetadataVersionError(f"ledger {ledger_id}: kept changing while deleting")

    async def tombstone_ledger(
        self, ledger_id: int, expected_version: int, tombstone: bytes
    ) -> Versioned[bytes]:
        check_value(tombstone_key(ledger_id), tombstone, self.config)
        key, stone_key = self._ledger_key(ledger_id), self._key(tombstone_key(ledger_id))
        current = await self.read_ledger(ledger_id)
        if current.version != expected_version:
            self.conn.counters["conflicts"] += 1
            raise MetadataVersionError(f"ledger {ledger_id} changed", current=current)
        creator_key = self._key("creators", current.value.creator_token)
        ok, responses, attempts = await self._txn(
            f"tombstone ledger {ledger_id}",
            compare=[tx.Mod(key) == expected_version],
            success=[tx.Put(stone_key, tombstone), tx.Delete(key), tx.Delete(creator_key)],
            failure=[tx.Get(key)],
        )
        if ok:
            return Versioned(tombstone, _put_revision(responses))
        found = _got(responses)
        if found is None:
            if attempts > 1:  # a lost reply: did our own first attempt land?
                stone = await self.conn.call(lambda c: c.get(stone_key), "read tombstone")
                if stone is not None and stone.value == tombstone:
                    return Versioned(tombstone, stone.mod_revision)
            raise no_such_ledger(ledger_id)
        self.conn.counters["conflicts"] += 1
        raise MetadataVersionError(
            f"ledger {ledger_id}: version {expected_version} is stale",
            current=Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision),
        )

    async def list_ledgers(self) -> AsyncIterator[int]:
        prefix = self._key("ledgers", "")
        start, end = prefix, prefix_end(prefix)
        while True:
            page = await self.conn.call(
                partial(self._range_page, start=start, end=end, keys_only=True), "list ledgers"
            )
            keys = [kv.key for kv in page.kvs]
            for key in keys:
                yield int(key[len(prefix) :])
            if not page.more or not keys:
                return
            start = keys[-1] + b"\x00"

    async def watch_ledger(
        self, ledger_id: int, since_version: int = 0
    ) -> AsyncGenerator[Versioned | None, None]:
        key = self._ledger_key(ledger_id)
        first = True
        while True:  # once, plus once per compaction of the history it needs
            found = await self.conn.call(lambda c: c.get(key), f"watch ledger {ledger_id}")
            if found is None and first:
                raise no_such_ledger(ledger_id)
            if found is None:  # deleted while the history was being compacted
                yield None
                return
            first = False
            if found.mod_revision > since_version:
                since_version = found.mod_revision
                yield Versioned(LedgerMetadata.from_json_bytes(found.value), found.mod_revision)
            try:
                events = self.conn.watch(key, None, found.header.revision + 1)
                async with aclosing(events):
                    async for event in events:
                        if event.kind == "DELETE":
                            yield None
                            return
                        if event.kv.mod_revision > since_version:
                            since_version = event.kv.mod_revision
                            value = LedgerMetadata.from_json_bytes(event.kv.value)
                            yield Versioned(value, event.kv.mod_revision)
                return  # the store was closed
            except WatchCompactedError:
                self.conn.counters["watch_compacted"] += 1

    # --- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self,
        bookie_id: str,
        address: str,
        rack: str | None,
        read_only: bool,
        incarnation: str = "",
    ) -> EtcdRegistration:
        check_bookie_id(bookie_id)
        registration = EtcdRegistration(
            self, BookieInfo(bookie_id, address, rack, read_only, incarnation)
        )
        await registration.start()
        self.registrations.append(registration)
        return registration

    async def _bookies(self) -> tuple[dict[str, BookieInfo], int]:
        prefix = self._key("bookies", "")
        found = await self.conn.call(lambda c: c.get_prefix(prefix), "list bookies")
        infos = [bookie_info_from_json(kv.value) for kv in found]
        return {info.bookie_id: info for info in sorted(infos)}, found.header.revision

    async def list_bookies(self) -> dict[str, BookieInfo]:
        return (await self._bookies())[0]

    async def watch_bookies(self) -> AsyncGenerator[dict[str, BookieInfo], None]:
        prefix = self._key("bookies", "")
        while True:  # once, plus once per compaction
            bookies, revision = await self._bookies()
            yield dict(bookies)
            try:
                events = self.conn.watch(prefix, prefix_end(prefix), revision + 1)
                async with aclosing(events):
                    async for event in events:
                        bookie_id = event.kv.key[len(prefix) :].decode()
                        if event.kind == "DELETE":
                            bookies.pop(bookie_id, None)
                        else:
                            bookies[bookie_id] = bookie_info_from_json(event.kv.value)
                        bookies = dict(sorted(bookies.items()))
                        yield dict(bookies)
                return  # the store was closed
            except WatchCompactedError:
                self.conn.counters["watch_compacted"] += 1

    # --- cookies and the instance id ------------------------------------------------------

    async def get_cookie(self, bookie_id: str) -> Versioned | None:
        check_bookie_id(bookie_id)
        key = self._key("cookies", bookie_id)
        found = await self.conn.call(lambda c: c.get(key), f"read cookie of {bookie_id}")
        return None if found is None else Versioned(found.value, found.mod_revision)

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned:
        check_cookie(bookie_id, data, self.config)
        key = self._key("cookies", bookie_id)
        check = tx.Create(key) == 0 if expected_version is None else tx.Mod(key) == expected_version
        ok, responses, attempts = await self._txn(
            f"write cookie of {bookie_id}", compare=[check], success=[tx.Put(key, data)],
            failure=[tx.Get(key)],
        )  # fmt: skip
        if ok:
            return Versioned(bytes(data), _put_revision(responses))
        found = _got(responses)
        current = None if found is None else Versioned(found.value, found.mod_revision)
        if attempts > 1 and current is not None and current.value == data:
            return current  # our first attempt landed
        self.conn.counters["conflicts"] += 1
        raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        check_bookie_id(bookie_id)
        key = self._key("cookies", bookie_id)
        ok, responses, attempts = await self._txn(
            f"delete cookie of {bookie_id}", compare=[tx.Mod(key) == expected_version],
            success=[tx.Delete(key)], failure=[tx.Get(key)],
        )  # fmt: skip
        found = None if ok else _got(responses)
        if ok or (found is None and attempts > 1):
            return
        current = None if found is None else Versioned(found.value, found.mod_revision)
        self.conn.counters["conflicts"] += 1
        raise MetadataVersionError(f"cookie of {bookie_id} changed", current=current)

    async def init_cluster(self) -> str:
        key, new_id = self._key("instanceid"), new_instance_id(self.rng)
        ok, responses, _ = await self._txn(
            "init cluster", compare=[tx.Create(key) == 0], success=[tx.Put(key, new_id.encode())],
            failure=[tx.Get(key)],
        )  # fmt: skip
        if ok:
            return new_id
        found = _got(responses)
        assert found is not None  # the key's creation failed in the same transaction: it exists
        return found.value.decode()

    async def get_instance_id(self) -> str | None:
        key = self._key("instanceid")
        found = await self.conn.call(lambda c: c.get(key), "read instance id")
        return None if found is None else found.value.decode()


class EtcdRegistration(BookieRegistration):
    """A bookie's key ``ROOT/bookies/<id>`` under an etcd lease (see ``registration.py``)."""

    def __init__(self, store: EtcdMetadataStore, info: BookieInfo) -> None:
        super().__init__(info, store.config.keepalive_interval_s)
        self.store = store
        self.lease_id = 0

    @property
    def _key(self) -> bytes:
        return self.store._key("bookies", self.info.bookie_id)

    async def _register(self) -> None:
        conn, ttl = self.store.conn, self.store.config.lease_ttl_s
        lease = await conn.call(lambda c: c.lease(ttl), f"lease for {self.info.bookie_id}")
        self.lease_id = lease.id
        await self._put()

    async def _put(self) -> None:
        key, value, lease_id = self._key, bookie_info_to_json(self.info), self.lease_id
        await self.store.conn.call(
            lambda c: c.put(key, value, lease=lease_id), f"register {self.info.bookie_id}"
        )

    async def _refresh(self) -> bool:
        lease_id = self.lease_id
        reply = await self.store.conn.call(
            lambda c: c.refresh_lease(lease_id), f"keepalive of {self.info.bookie_id}"
        )
        return reply is not None and reply.TTL > 0

    async def _publish(self) -> None:
        try:
            await self._put()
        except LeaseNotFoundError:
            self.reregistrations += 1
            await self._register()

    async def _revoke(self) -> None:
        lease_id = self.lease_id
        try:
            await self.store.conn.call(
                lambda c: c.revoke_lease(lease_id), f"unregister {self.info.bookie_id}"
            )
        except LeaseNotFoundError:
            pass

    def _detach(self) -> None:
        if self in self.store.registrations:
            self.store.registrations.remove(self)
