"""Gateways in etcd: node ids, registration, and who owns which partition and group.

Theory of operation
-------------------
Several gateways may serve one cluster. Kafka clients need an int32 node id per broker and a
leader per partition, so each gateway

* has a **node id** kept for its advertised address (``kafka/node-ids/<address>``, allocated
  once from a counter by compare-and-swap): a gateway restarted on the same address is the
  same broker to clients;
* is **registered** under its lease (``kafka/gateways/<address>``): the brokers list of a
  Metadata answer;
* **claims** what it serves, under the same lease: ``kafka/owners/<topic>/<partition>`` for a
  partition whose log it writes, ``kafka/coordinators/<group>`` for a group it coordinates.
  A claim is a create-only put; a key held by another live gateway means "ask that one"
  (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR). A key left by an earlier incarnation of this
  gateway (same address, another lease) is taken back at once, so a gateway restarted after
  kill -9 serves its partitions again without waiting for the old lease to expire; a key of a
  gateway that died goes with its lease (``kafka_lease_ttl_s``), and then anyone may claim it.

A claim only routes clients. Safety comes from the log: taking a partition over fences the
previous writer, so a gateway that lost its claim without noticing (paused past its lease)
cannot append any more; its next append fails and it answers NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

from ..config import parse_address
from ..errors import MetadataUnavailableError, MetadataVersionError
from ..metadata.lease import Lease
from ..metadata.store import MetadataStore

GATEWAYS = "kafka/gateways/"
NODE_IDS = "kafka/node-ids/"
NODE_ID_COUNTER = "kafka/node-id-counter"
CLAIM_ATTEMPTS_MAX = 16


def key_segment(text: str) -> str:
    """Any string (a Kafka group id may hold spaces or ``/``) as one key segment:
    percent-encoded, ``%00`` for the empty string."""
    return quote(text, safe="") or "%00"


@dataclass(frozen=True, slots=True)
class GatewayInfo:
    """A gateway as clients see it."""

    node_id: int
    address: str  # HOST:PORT, advertised

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_address(self.address)


class Membership:
    """This gateway's identity and claims in the metadata store."""

    def __init__(self, store: MetadataStore, address: str) -> None:
        self.store = store
        self.address = address
        self.node_id = -1
        self.lease: Lease | None = None
        self.claims = 0

    @property
    def me(self) -> GatewayInfo:
        return GatewayInfo(self.node_id, self.address)

    async def register(self, lease_ttl_s: int) -> None:
        """Learn (or allocate) the node id, grant a lease and register under it."""
        self.node_id = await self._node_id()
        self.lease = await self.store.grant_lease(lease_ttl_s)
        await self.store.put(GATEWAYS + self.address, self._value(), lease=self.lease)

    async def unregister(self) -> None:
        """Revoke the lease: the registration and every claim go at once."""
        if self.lease is not None:
            lease, self.lease = self.lease, None
            await lease.revoke()

    async def gateways(self) -> list[GatewayInfo]:
        """Every live gateway, by node id."""
        found = [_info(v.value) async for _, v in self.store.list_prefix(GATEWAYS)]
        return sorted(found, key=lambda g: g.node_id)

    async def claim(self, key: str) -> GatewayInfo | None:
        """Claim ``key`` for this gateway: None if it is ours now, else its live owner.

        Raises:
            MetadataUnavailableError: the store is unreachable, or the claim kept losing
                races, or this gateway has no live lease.
        """
        if self.lease is None or not self.lease.alive:
            raise MetadataUnavailableError("this gateway's lease is gone; it is re-registering")
        current = await self.store.get(key)
        for _ in range(CLAIM_ATTEMPTS_MAX):
            expected = 0
            if current is not None:
                owner = json.loads(current.value)
                if owner["lease"] == self.lease.lease_id:
                    return None
                if owner["address"] != self.address:
                    return _info(current.value)
                expected = current.version  # an earlier incarnation of this gateway
            try:
                await self.store.put(
                    key, self._value(), expected_version=expected, lease=self.lease
                )
                self.claims += 1
                return None
            except MetadataVersionError as exc:
                current = exc.current
        raise MetadataUnavailableError(f"claim of {key} lost {CLAIM_ATTEMPTS_MAX} races")

    async def owner(self, key: str) -> GatewayInfo | None:
        """Who holds ``key`` (None: nobody)."""
        current = await self.store.get(key)
        return None if current is None else _info(current.value)

    async def owners(self, prefix: str) -> dict[str, GatewayInfo]:
        """Every claim under ``prefix``: key -> owner."""
        return {key: _info(v.value) async for key, v in self.store.list_prefix(prefix)}

    def _value(self) -> bytes:
        assert self.lease is not None
        doc = {"node_id": self.node_id, "address": self.address, "lease": self.lease.lease_id}
        return json.dumps(doc, sort_keys=True).encode()

    async def _node_id(self) -> int:
        key = NODE_IDS + self.address
        for _ in range(CLAIM_ATTEMPTS_MAX):
            existing = await self.store.get(key)
            if existing is not None:
                return int(existing.value)
            counter = await self.store.get(NODE_ID_COUNTER)
            node_id = 1 + (int(counter.value) if counter else 0)
            try:
                version = counter.version if counter else 0
                await self.store.put(
                    NODE_ID_COUNTER, str(node_id).encode(), expected_version=version
                )
                await self.store.put(key, str(node_id).encode(), expected_version=0)
                return node_id
            except MetadataVersionError:
                continue  # another gateway allocated meanwhile: read again
        raise MetadataUnavailableError("could not allocate a node id")


def _info(value: bytes) -> GatewayInfo:
    doc = json.loads(value)
    return GatewayInfo(int(doc["node_id"]), str(doc["address"]))
