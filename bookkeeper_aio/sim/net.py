"""A simulated network: in-memory transports with delay, loss, duplication, reordering,
partitions and slow nodes, every choice drawn from one seeded rng.

Theory of operation
-------------------
Each simulated process gets a :class:`NodeNetwork` (``SimNetwork.view(name)``), which
implements the :class:`~bookkeeper_aio.net.Network` seam, so bookies and clients open
listeners and connections exactly as on TCP and their asyncio ``Protocol`` objects get
``connection_made`` / ``data_received`` / ``connection_lost`` as usual.

The unit of delivery is one ``write``: both sides only ever write whole frames (the bookie
coalesces a loop iteration's replies into one ``writelines``), so dropping, duplicating or
reordering a write never cuts a frame. Per write, in this order: a partition between the two
nodes, a loss aimed at the link (``drop_next``: the next n writes; ``cut_after``: every write
after the next n) or ``loss_rate`` drops it (the connection stays up: the sender's request
times out, as with a stalled TCP connection); otherwise it arrives after ``latency_s``
(uniform) plus the extra latency of slow endpoints and of a slow link (one direction);
``reorder_rate`` adds up to ``reorder_delay_s`` and lets the write overtake earlier ones
(writes otherwise keep FIFO order per direction);
``duplicate_rate`` delivers it a second time. The first write of a connection (the handshake)
is never lost, duplicated or reordered: the point is to test the protocol, not the handshake.

A crashed node (:meth:`SimNetwork.kill_node`) loses its listeners and every connection; the
peers see ``connection_lost`` after one latency, like a reset.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class NetFaults:
    """Fault rates of the simulated network (per write)."""

    latency_s: tuple[float, float] = (0.0002, 0.002)
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0
    reorder_rate: float = 0.0
    reorder_delay_s: float = 0.05


class SimNetwork:
    """Every node's view of one simulated network (see the module docstring)."""

    def __init__(self, rng: random.Random, faults: NetFaults | None = None) -> None:
        self.rng = rng
        self.faults = faults or NetFaults()
        self.listeners: dict[str, tuple[str, Callable[[], asyncio.Protocol]]] = {}
        self.partitions: set[frozenset[str]] = set()
        self.slow_s: dict[str, float] = {}  # node -> extra latency of all its traffic
        self.slow_link_s: dict[tuple[str, str], float] = {}  # (src, dst) -> extra latency
        # (src, dst) -> how many of the next writes on that link are lost (not the handshake)
        self.drop_next: Counter[tuple[str, str]] = Counter()
        # (src, dst) -> how many more writes pass; every later one is lost (until removed)
        self.cut_after: dict[tuple[str, str], int] = {}
        self.transports: list[SimTransport] = []
        self.counters: Counter[str] = Counter()

    def view(self, node: str) -> NodeNetwork:
        """The :class:`~bookkeeper_aio.net.Network` seen by process ``node``."""
        return NodeNetwork(self, node)

    def partition(self, a: str, b: str) -> None:
        self.partitions.add(frozenset((a, b)))

    def unpartition(self, a: str, b: str) -> None:
        self.partitions.discard(frozenset((a, b)))

    def heal(self) -> None:
        """Remove every partition and slow node; keep the random fault rates."""
        self.partitions.clear()
        self.slow_s.clear()
        self.slow_link_s.clear()
        self.drop_next.clear()
        self.cut_after.clear()

    def kill_node(self, node: str) -> None:
        """``node`` crashed: its listeners vanish and every connection of it is reset."""
        for address in [a for a, (n, _) in self.listeners.items() if n == node]:
            del self.listeners[address]
        for transport in list(self.transports):
            if node in (transport.local, transport.remote):
                transport.abort()

    def latency(self, src: str, dst: str) -> float:
        low, high = self.faults.latency_s
        slow = self.slow_s.get(src, 0.0) + self.slow_s.get(dst, 0.0)
        return self.rng.uniform(low, high) + slow + self.slow_link_s.get((src, dst), 0.0)

    def cut(self, src: str, dst: str) -> bool:
        return frozenset((src, dst)) in self.partitions


class _SimServer:
    def __init__(self, net: SimNetwork, address: str) -> None:
        self._net = net
        self._address = address

    def close(self) -> None:
        self._net.listeners.pop(self._address, None)

    async def wait_closed(self) -> None:
        return None


class NodeNetwork:
    """One node's :class:`~bookkeeper_aio.net.Network`."""

    def __init__(self, net: SimNetwork, node: str) -> None:
        self.net = net
        self.node = node

    async def start_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> _SimServer:
        if address in self.net.listeners:
            raise OSError(f"address in use: {address}")
        self.net.listeners[address] = (self.node, protocol_factory)
        return _SimServer(self.net, address)

    async def connect(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        net = self.net
        listener = net.listeners.get(address)
        remote = listener[0] if listener else address
        await asyncio.sleep(2 * net.latency(self.node, remote))
        listener = net.listeners.get(address)
        if listener is None:
            raise ConnectionRefusedError(f"simulated: nothing listens on {address}")
        if net.cut(self.node, listener[0]):
            await asyncio.sleep(1.0)
            raise OSError(f"simulated: {address} unreachable (partition)")
        client = SimTransport(net, self.node, listener[0])
        server = SimTransport(net, listener[0], self.node)
        client.peer, server.peer = server, client
        server_protocol = listener[1]()
        client_protocol = protocol_factory()
        server.attach(server_protocol)
        client.attach(client_protocol)
        net.counters["connections"] += 1
        return client, client_protocol


class SimTransport(asyncio.Transport):
    """One end of a simulated connection."""

    def __init__(self, net: SimNetwork, local: str, remote: str) -> None:
        super().__init__()
        self.net = net
        self.local = local
        self.remote = remote
        self.peer: SimTransport | None = None
        self.protocol: asyncio.Protocol | None = None
        self._closing = False
        self._lost = False
        self._paused = False
        self._held: list[bytes] = []
        self._writes = 0
        self._last_arrival = 0.0
        self._loop = asyncio.get_running_loop()

    def attach(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol
        self.net.transports.append(self)
        protocol.connection_made(self)

    # --- output ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None:
            return
        net, faults, rng = self.net, self.net.faults, self.net.rng
        first = self._writes == 0
        self._writes += 1
        if net.cut(self.local, self.remote) or (not first and self._dropped()):
            net.counters["lost"] += 1
            return
        data = bytes(data)
        now = self._loop.time()
        arrival = now + net.latency(self.local, self.remote)
        if not first and rng.random() < faults.reorder_rate:
            net.counters["reordered"] += 1
            arrival += rng.uniform(0, faults.reorder_delay_s)
        else:
            arrival = self._last_arrival = max(arrival, self._last_arrival)
        self._loop.call_at(arrival, self.peer.deliver, data)
        if not first and rng.random() < faults.duplicate_rate:
            net.counters["duplicated"] += 1
            again = now + net.latency(self.local, self.remote) + faults.reorder_delay_s
            self._loop.call_at(again, self.peer.deliver, data)

    def _dropped(self) -> bool:
        link = (self.local, self.remote)
        if self.net.drop_next[link] > 0:
            self.net.drop_next[link] -= 1
            return True
        passing = self.net.cut_after.get(link)
        if passing is not None:
            self.net.cut_after[link] = passing - 1
            return passing <= 0
        return self.net.rng.random() < self.net.faults.loss_rate

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def deliver(self, data: bytes) -> None:
        """Data from the peer arrives."""
        if self._lost or self._closing:
            return
        if self._paused:
            self._held.append(data)
            return
        assert self.protocol is not None
        self.protocol.data_received(data)

    # --- flow control and closing ---------------------------------------------------------

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            held, self._held = self._held, []
            for data in held:
                self._loop.call_soon(self.deliver, data)

    def is_reading(self) -> bool:
        return not self._paused

    def close(self) -> None:
        """Orderly close: what was written still arrives, then both ends see the close."""
        if self._closing:
            return
        self._closing = True
        delay = self.net.latency(self.local, self.remote)
        self._loop.call_at(max(self._loop.time() + delay, self._last_arrival), self._fin)

    def _fin(self) -> None:
        self._lose()
        if self.peer is not None:
            self.peer._lose()

    def abort(self) -> None:
        """Reset: this end sees the loss now, the peer one latency later."""
        self._closing = True
        self._loop.call_soon(self._lose)
        if self.peer is not None:
            self.peer._closing = True
            delay = self.net.latency(self.local, self.remote)
            self._loop.call_later(delay, self.peer._lose)

    def _lose(self) -> None:
        if self._lost:
            return
        self._lost = self._closing = True
        self._held.clear()
        if self in self.net.transports:
            self.net.transports.remove(self)
        if self.protocol is not None:
            self.protocol.connection_lost(None)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.remote if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False
