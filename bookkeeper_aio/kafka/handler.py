"""Requests to answers: one method per API.

Theory of operation
-------------------
:meth:`RequestHandler.start` runs in the connection's read loop, in request order, and does
only what must happen in that order: a produce request's batches get their offsets and their
appends are issued there, so two produce requests on one connection append in the order they
were sent. It returns a coroutine for the rest (waiting for acknowledgements, a fetch's long
poll, a join's barrier), which the connection runs as a task and answers in request order;
None for a produce with acks=0, which gets no answer.

Every operating error becomes a Kafka error code for the partition, group or request it
concerns (``errors.code_for``); an unexpected exception is logged with its traceback and
answered as UNKNOWN_SERVER_ERROR, never dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

from . import codec
from . import messages as m
from .errors import ErrorCode, KafkaError, code_for
from .gateway import Gateway
from .partition import OwnedPartition
from .topics import OWNERS

log = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1  # ListOffsets timestamps


def _code(exc: BaseException, what: str) -> ErrorCode:
    code = code_for(exc)
    if code is ErrorCode.UNKNOWN_SERVER_ERROR:
        log.error("%s failed unexpectedly", what, exc_info=exc)
    return code


class RequestHandler:
    """The gateway's answers (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.config = gateway.config

    async def start(
        self, header: m.RequestHeader, request: m.Request
    ) -> Coroutine[Any, Any, Any] | None:
        """Do the ordered part of a request; return the rest (None: no answer)."""
        if isinstance(request, m.ProduceRequest):
            return await self._start_produce(request)
        client_id = header.client_id or ""
        match request:
            case m.ApiVersionsRequest():
                return _now(codec.api_versions())
            case m.MetadataRequest():
                return self.metadata(request)
            case m.FetchRequest():
                return self.fetch(request)
            case m.ListOffsetsRequest():
                return self.list_offsets(request)
            case m.FindCoordinatorRequest():
                return self.find_coordinator(request)
            case m.JoinGroupRequest():
                return self._group_call(
                    self.gw.coordinator.join(request, client_id), m.JoinGroupResponse
                )
            case m.SyncGroupRequest():
                return self._group_call(self.gw.coordinator.sync(request), m.SyncGroupResponse)
            case m.HeartbeatRequest():
                return self._group_code(self.gw.coordinator.heartbeat(request), m.HeartbeatResponse)
            case m.LeaveGroupRequest():
                return self._group_code(self.gw.coordinator.leave(request), m.LeaveGroupResponse)
            case m.OffsetCommitRequest():
                return self.offset_commit(request)
            case m.OffsetFetchRequest():
                return self.offset_fetch(request)
            case m.InitProducerIdRequest():
                return self.init_producer_id(request)
        raise AssertionError(f"no handler for {type(request).__name__}")

    # --- produce --------------------------------------------------------------------------

    async def _start_produce(self, req: m.ProduceRequest) -> Coroutine[Any, Any, Any] | None:
        issued: list[tuple[str, int, int | ErrorCode, Awaitable[None] | None]] = []
        for topic in req.topics:
            for p in topic.partitions:
                try:
                    if req.transactional_id is not None:
                        raise KafkaError(
                            "transactions are not supported", ErrorCode.INVALID_REQUEST
                        )
                    partition = await self.gw.partition(topic.name, p.index, auto_create=True)
                    # Only the wait for room in the log writer can block here; the append
                    # itself is issued synchronously after it.
                    async with asyncio.timeout(self.config.kafka_produce_wait_ms_max / 1000):
                        base_offset, ack = await partition.append(p.records)
                    issued.append((topic.name, p.index, base_offset, ack))
                except Exception as exc:
                    issued.append((topic.name, p.index, _code(exc, "produce"), None))
        if req.acks == 0:
            return None
        return self._finish_produce(req, issued)

    async def _finish_produce(self, req: m.ProduceRequest, issued: list) -> m.ProduceResponse:
        acks = {id(a): a for _, _, _, a in issued if a is not None}
        if acks:
            timeout_s = min(max(req.timeout_ms, 0), self.config.kafka_produce_wait_ms_max) / 1000
            await asyncio.wait([asyncio.ensure_future(a) for a in acks.values()], timeout=timeout_s)
        by_topic: dict[str, list[m.ProducePartitionResponse]] = {}
        for topic, index, base, ack in issued:
            result = self._ack_result(index, base, ack)
            by_topic.setdefault(topic, []).append(result)
        return m.ProduceResponse(tuple((t, tuple(ps)) for t, ps in by_topic.items()))

    def _ack_result(self, index: int, base: Any, ack: Any) -> m.ProducePartitionResponse:
        if ack is None:
            return m.ProducePartitionResponse(index, base)
        future = asyncio.ensure_future(ack)
        if not future.done():
            return m.ProducePartitionResponse(index, ErrorCode.REQUEST_TIMED_OUT)
        if future.cancelled() or future.exception() is not None:
            exc = future.exception() if not future.cancelled() else asyncio.CancelledError()
            return m.ProducePartitionResponse(index, _code(exc, "append"))
        return m.ProducePartitionResponse(index, ErrorCode.NONE, base, 0)

    # --- fetch ----------------------------------------------------------------------------

    async def fetch(self, req: m.FetchRequest) -> m.FetchResponse:
        """Read whole batches; wait up to max_wait for min_bytes (woken by appends)."""
        loop = asyncio.get_running_loop()
        deadline = (
            loop.time() + min(max(req.max_wait_ms, 0), self.config.kafka_fetch_wait_ms_max) / 1000
        )
        while True:
            topics, total, waits = await self._fetch_once(req)
            remaining = deadline - loop.time()
            if total >= req.min_bytes or not waits or remaining <= 0:
                return m.FetchResponse(topics)
            tasks = [
                asyncio.ensure_future(part.log.wait_for_more(offset)) for part, offset in waits
            ]
            try:
                await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()

    async def _fetch_once(self, req: m.FetchRequest) -> tuple[tuple, int, list]:
        budget = min(req.max_bytes, self.config.kafka_fetch_bytes_max)
        topics, total, waits = [], 0, []
        for topic in req.topics:
            parts = []
            for p in topic.partitions:
                try:
                    partition = await self.gw.partition(topic.name, p.index)
                    limit = min(p.partition_max_bytes, budget - total)
                    data = await partition.fetch(p.fetch_offset, limit) if limit > 0 else b""
                except Exception as exc:
                    parts.append(m.FetchPartitionResponse(p.index, _code(exc, "fetch")))
                    continue
                total += len(data)
                if not data:
                    waits.append((partition, p.fetch_offset))
                plog = partition.log
                parts.append(
                    m.FetchPartitionResponse(
                        p.index, ErrorCode.NONE, plog.high_watermark, plog.log_start_offset, data
                    )
                )
            topics.append((topic.name, tuple(parts)))
        return tuple(topics), total, waits

    # --- offsets and metadata -------------------------------------------------------------

    async def list_offsets(self, req: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        topics = []
        for name, parts in req.topics:
            results = []
            for index, timestamp in parts:
                results.append(await self._list_offset(name, index, timestamp))
            topics.append((name, tuple(results)))
        return m.ListOffsetsResponse(tuple(topics))

    async def _list_offset(
        self, name: str, index: int, timestamp: int
    ) -> m.ListOffsetsPartitionResponse:
        try:
            partition: OwnedPartition = await self.gw.partition(name, index)
        except Exception as exc:
            return m.ListOffsetsPartitionResponse(index, _code(exc, "list offsets"))
        if timestamp == LATEST:
            return m.ListOffsetsPartitionResponse(
                index, ErrorCode.NONE, partition.log.high_watermark
            )
        if timestamp == EARLIEST:
            return m.ListOffsetsPartitionResponse(
                index, ErrorCode.NONE, partition.log.log_start_offset
            )
        # Offsets by time would need a time index; not kept (docs/kafka.md).
        return m.ListOffsetsPartitionResponse(index, ErrorCode.INVALID_REQUEST)

    async def metadata(self, req: m.MetadataRequest) -> m.MetadataResponse:
        """Brokers = live gateways; a partition's leader = its owner, or this gateway when it
        has none (a produce or fetch here will take it over)."""
        gateways = await self.gw.membership.gateways()
        me = self.gw.membership.me
        if me not in gateways:
            gateways.append(me)
        live = {g.node_id for g in gateways}
        if req.topics is None:
            infos: list[Any] = await self.gw.topics.list()
        else:
            infos = []
            for name in req.topics:
                try:
                    infos.append(await self.gw.topic(name, req.allow_auto_topic_creation))
                except Exception as exc:
                    infos.append((name, _code(exc, "metadata")))
        topics = []
        for info in infos:
            if isinstance(info, tuple):
                topics.append(m.TopicMetadata(info[1], info[0], ()))
                continue
            claims = await self.gw.membership.owners(f"{OWNERS}{info.name}/")
            owners = {int(key.rsplit("/", 1)[1]): g.node_id for key, g in claims.items()}
            parts = tuple(
                m.PartitionMetadata(
                    ErrorCode.NONE, p, owners[p] if owners.get(p) in live else me.node_id
                )
                for p in range(info.partitions)
            )
            topics.append(m.TopicMetadata(ErrorCode.NONE, info.name, parts))
        brokers = tuple(m.Broker(g.node_id, *g.host_port) for g in gateways)
        return m.MetadataResponse(brokers, self.gw.cluster_id, me.node_id, tuple(topics))

    # --- groups ---------------------------------------------------------------------------

    async def find_coordinator(self, req: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        if req.key_type != 0:
            return m.FindCoordinatorResponse(ErrorCode.INVALID_REQUEST)  # transactions
        try:
            coordinator = await self.gw.coordinator.find(req.key)
        except Exception as exc:
            return m.FindCoordinatorResponse(_code(exc, "find coordinator"))
        return m.FindCoordinatorResponse(
            ErrorCode.NONE, coordinator.node_id, *coordinator.host_port
        )

    async def _group_call(self, call: Awaitable[Any], kind: type) -> Any:
        try:
            return await call
        except Exception as exc:
            return kind(_code(exc, kind.__name__))

    async def _group_code(self, call: Awaitable[ErrorCode], kind: type) -> Any:
        try:
            return kind(await call)
        except Exception as exc:
            return kind(_code(exc, kind.__name__))

    async def offset_commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        try:
            return await self.gw.coordinator.commit(req)
        except Exception as exc:
            code = int(_code(exc, "offset commit"))
            topics = tuple((t, tuple((p, code) for p, _, _ in ps)) for t, ps in req.topics)
            return m.OffsetCommitResponse(topics)

    async def offset_fetch(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        try:
            return await self.gw.coordinator.fetch_offsets(req)
        except Exception as exc:
            code = _code(exc, "offset fetch")
            topics = tuple(
                (t, tuple(m.OffsetFetchPartitionResponse(p, -1, "", code) for p in ps))
                for t, ps in req.topics or ()
            )
            return m.OffsetFetchResponse(topics, code)

    async def init_producer_id(self, req: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        if req.transactional_id is not None:
            return m.InitProducerIdResponse(ErrorCode.INVALID_REQUEST)  # no transactions
        try:
            return m.InitProducerIdResponse(ErrorCode.NONE, await self.gw.new_producer_id(), 0)
        except Exception as exc:
            return m.InitProducerIdResponse(_code(exc, "init producer id"))


async def _now(response: Any) -> Any:
    return response
