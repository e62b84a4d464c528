"""The gateway: one process's partitions, groups, topics and listening socket.

Theory of operation
-------------------
:meth:`Gateway.serve` registers the gateway (``ownership.py``), starts the group
coordinator's loop and a watch on its lease, and listens; leaving the context stops
listening, closes connections, closes the partitions' log writers and revokes the lease (so
other gateways may take its partitions and groups over at once).

:meth:`Gateway.partition` is how any request reaches a partition: a partition this gateway
owns is served at once; otherwise it claims it (NOT_LEADER_OR_FOLLOWER if another live
gateway holds it) and takes its log over — one takeover at a time per partition. A partition
whose log failed or was fenced is taken over again by the next request. If the gateway's
lease is lost (a pause longer than its TTL, etcd out of reach) it drops everything it owned
and registers again: whatever it held may have been claimed by someone else meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator

from ..config import KafkaConfig, parse_address
from ..errors import MetadataVersionError
from ..metadata.store import MetadataStore
from .coordinator import Coordinator
from .errors import ErrorCode, KafkaError, NotLeaderError, TopicExistsError, UnknownTopicError
from .ownership import Membership
from .partition import OwnedPartition, PartitionState, PartitionStorage
from .topics import OWNERS, TopicInfo, Topics

log = logging.getLogger(__name__)

PRODUCER_ID_COUNTER = "kafka/producer-id-counter"


class Gateway:
    """One Kafka gateway (see the module docstring)."""

    def __init__(
        self,
        config: KafkaConfig,
        store: MetadataStore,
        storage: PartitionStorage,
        rng: random.Random | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.store = store
        self.storage = storage
        self.rng = rng or random.Random()
        self.membership = Membership(store, config.advertised_address)
        self.topics = Topics(store, storage)
        self.coordinator = Coordinator(config, self.membership, storage, self.topics, self.rng)
        self.owned: dict[tuple[str, int], OwnedPartition] = {}
        self._takeovers: dict[tuple[str, int], asyncio.Lock] = {}
        self._producer_ids: range = range(0)
        self._producer_id_lock = asyncio.Lock()
        self.cluster_id = "bookkeeper-aio"
        self.server: asyncio.Server | None = None
        self.connections: set = set()  # KafkaConnection objects (connection.py)

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(
        cls,
        config: KafkaConfig,
        store: MetadataStore,
        storage: PartitionStorage,
        rng: random.Random | None = None,
    ) -> AsyncIterator[Gateway]:
        """Register, listen, and serve until the context exits."""
        from .connection import KafkaConnection

        gateway = cls(config, store, storage, rng)
        await gateway.membership.register(config.kafka_lease_ttl_s)
        gateway.cluster_id = await store.get_instance_id() or gateway.cluster_id
        host, port = parse_address(config.kafka_listen)
        async with asyncio.TaskGroup() as tasks:
            loops = [
                tasks.create_task(gateway.coordinator.run(), name="kafka-coordinator"),
                tasks.create_task(gateway._watch_lease(), name="kafka-lease"),
            ]
            gateway.server = await asyncio.start_server(
                lambda r, w: KafkaConnection(gateway, r, w).run(), host, port
            )
            try:
                yield gateway
            finally:
                await gateway._shutdown()
                for task in loops:  # they run until cancelled
                    task.cancel()

    @property
    def port(self) -> int:
        """The port it listens on (useful with port 0)."""
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    # --- partitions -----------------------------------------------------------------------

    async def partition(self, topic: str, index: int, auto_create: bool = False) -> OwnedPartition:
        """The partition, owned by this gateway (claimed and taken over if need be).

        Raises:
            UnknownTopicError: no such topic or partition (auto-creation off).
            NotLeaderError: another live gateway owns it.
            MetadataUnavailableError, BookKeeperError: the takeover failed.
        """
        key = (topic, index)
        owned = self.owned.get(key)
        if owned is not None and owned.state is PartitionState.OWNED:
            return owned
        lock = self._takeovers.setdefault(key, asyncio.Lock())
        async with lock:
            owned = self.owned.get(key)  # re-checked: another request may have taken it over
            if owned is not None and owned.state is PartitionState.OWNED:
                return owned
            info = await self.topic(topic, auto_create)
            if not 0 <= index < info.partitions:
                raise UnknownTopicError(f"{topic} has no partition {index}")
            owner = await self.membership.claim(f"{OWNERS}{topic}/{index}")
            if owner is not None:
                raise NotLeaderError(f"{topic}-{index} is owned by {owner.address}")
            fresh = await self._take_over(info, index)
            if owned is not None:
                await owned.log.close()
            self.owned[key] = fresh
            return fresh

    async def _take_over(self, info: TopicInfo, index: int) -> OwnedPartition:
        async with asyncio.timeout(self.config.kafka_takeover_timeout_s):
            try:
                plog = await self.storage.take_over(info.name, index)
            except UnknownTopicError:  # a create interrupted before this log was made
                await self.storage.create_partitions(
                    info.name, range(index, index + 1), info.quorum
                )
                plog = await self.storage.take_over(info.name, index)
            partition = OwnedPartition(
                info.name, index, plog,
                self.config.kafka_batch_bytes_max, self.config.kafka_producers_max,
            )  # fmt: skip
            await partition.rebuild_producers(self.config.kafka_producer_state_batches_max)
        log.info("took %s-%d over at offset %d", info.name, index, partition.next_offset)
        return partition

    async def topic(self, name: str, auto_create: bool = False) -> TopicInfo:
        """The topic's metadata; created with the defaults if it does not exist, ``auto_create``
        is asked for and ``kafka_auto_create_topics`` is on.

        Raises:
            UnknownTopicError: no such topic.
            InvalidTopicError: auto-creation of a name Kafka would refuse.
        """
        info = await self.topics.get(name)
        if info is None and auto_create and self.config.kafka_auto_create_topics:
            c = self.config
            try:
                info = await self.topics.create(
                    name, c.kafka_default_partitions, c.kafka_default_ensemble_size,
                    c.kafka_default_write_quorum, c.kafka_default_ack_quorum,
                )  # fmt: skip
                log.info("auto-created topic %s (%d partitions)", name, info.partitions)
            except TopicExistsError:
                info = await self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"no topic {name}")
        return info

    # --- producer ids ---------------------------------------------------------------------

    async def new_producer_id(self) -> int:
        """A producer id no other producer of the cluster got (reserved in blocks)."""
        async with self._producer_id_lock:
            if not self._producer_ids:
                self._producer_ids = await self._reserve_producer_ids()
            producer_id = self._producer_ids[0]
            self._producer_ids = self._producer_ids[1:]
            return producer_id

    async def _reserve_producer_ids(self) -> range:
        block = self.config.kafka_producer_id_block
        for _ in range(16):
            current = await self.store.get(PRODUCER_ID_COUNTER)
            start = int(current.value) if current else 0
            try:
                version = current.version if current else 0
                await self.store.put(PRODUCER_ID_COUNTER, str(start + block).encode(), version)
                return range(start, start + block)
            except MetadataVersionError:
                continue
        raise KafkaError("could not reserve producer ids", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    # --- lifecycle ------------------------------------------------------------------------

    async def _watch_lease(self) -> None:
        while True:
            lease = self.membership.lease
            if lease is None:
                return  # unregistered: the gateway is stopping
            await lease.lost.wait()
            if self.membership.lease is not lease:
                continue
            log.error("gateway lease lost: dropping every partition and group, re-registering")
            self._drop_everything("lease lost")
            while True:
                try:
                    await self.membership.register(self.config.kafka_lease_ttl_s)
                    break
                except Exception as exc:  # retried: a gateway without a lease serves nothing
                    log.warning("re-registering failed: %r", exc)
                    await asyncio.sleep(1.0)

    def _drop_everything(self, why: str, quiet: bool = False) -> None:
        for partition in self.owned.values():
            partition.fail(NotLeaderError(why), quiet)
        self.coordinator.drop_all(why)

    async def _shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
        # Parked joins and syncs get NOT_COORDINATOR now rather than waiting for barriers.
        self._drop_everything("gateway shutting down", quiet=True)
        for conn in list(self.connections):
            conn.close()
        tasks = [conn.task for conn in self.connections if conn.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.kafka_shutdown_timeout_s)
            for task in pending:  # answers nobody takes: the connection goes now
                task.cancel()
        for partition in list(self.owned.values()):
            with contextlib.suppress(Exception):
                await partition.log.close()
        self.owned.clear()
        with contextlib.suppress(Exception):
            await self.membership.unregister()

    def statistics(self) -> dict[str, object]:
        """Counters: connections, owned partitions, groups."""
        return {
            "node_id": self.membership.node_id,
            "connections": len(self.connections),
            "partitions": {f"{t}-{p}": o.statistics() for (t, p), o in sorted(self.owned.items())},
            **self.coordinator.statistics(),
        }
