"""The simulated cluster: bookie nodes that crash and restart, clients, one metadata store.

Theory of operation
-------------------
A :class:`World` owns the seeded rng, the :class:`~bookkeeper_aio.sim.net.SimNetwork`, the
shared in-memory metadata state and the bookie nodes. A :class:`SimBookie` runs the real
:class:`~bookkeeper_aio.bookie.server.Bookie` on the simulated network and storage; ``crash``
aborts it (``kill -9``: no cleanup, the lease expires later) and keeps on its
:class:`~bookkeeper_aio.sim.disk.NodeDisk` what the crash model says survives; ``start``
boots a new incarnation from that disk, replaying its journal. Clients are real
:class:`~bookkeeper_aio.client.bookkeeper.BookKeeper` objects built on the same seams.

The world also has a god's view for the checkers: :meth:`SimBookie.stored` says what a bookie
holds (running: its engine; crashed: what its disk would give back on restart), and every
version of every ledger's metadata is reported to ``on_metadata`` as it is written.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from engines.memory import MemoryDisk, MemoryEngine

from ..bookie.integrity import BOOKIE_BUGS
from ..bookie.records import replay_into
from ..bookie.server import Bookie
from ..client.bookie_pool import BookiePool
from ..client.bookkeeper import BookKeeper
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import BookieConfig, ClientConfig, MetadataConfig
from ..digest import unpack_entry_record
from ..metadata.memory import MemoryFaults, MemoryMetadataStore, MemoryState
from ..metadata.memory_keys import KeySpace
from ..metadata.model import LedgerMetadata, Versioned
from .disk import DiskFaults, NodeDisk, SimStorage
from .net import NetFaults, SimNetwork

log = logging.getLogger(__name__)

METADATA_CONFIG = MetadataConfig(
    call_timeout_s=2.0,
    attempt_timeout_s=1.0,
    retry_backoff_s=0.02,
    lease_ttl_s=2,
    keepalive_interval_s=0.5,
)

CLIENT_CONFIG = ClientConfig(
    connect_timeout_s=0.5,
    request_timeout_s=1.0,
    timeout_sweep_interval_s=0.05,
    reconnect_backoff_s=0.05,
    reconnect_backoff_max_s=0.5,
    explicit_lac_interval_s=0.2,
    speculative_read_timeout_s=0.2,
    long_poll_timeout_ms=500,
    close_timeout_s=5.0,
    adds_pending_max=64,
    mark_short_copies=False,  # autorecovery seeds turn it on (sim/autorecovery.py)
)


class RecordingState(MemoryState):
    """The shared metadata state, reporting every ledger version it stores."""

    keys: RecordingKeySpace  # World gives it one

    on_metadata: Callable[[int, Versioned | None], None] | None = None

    def notify_ledger(self, ledger_id: int, value: Versioned | None) -> None:
        if self.on_metadata is not None:
            self.on_metadata(ledger_id, value)
        super().notify_ledger(ledger_id, value)


class RecordingKeySpace(KeySpace):
    """The store's keys, reporting every key state as it is stored (the log checkers)."""

    on_key: Callable[[str, Versioned | None], None] | None = None

    def _notify(self, key: str) -> None:
        if self.on_key is not None:
            self.on_key(key, self.get(key))
        super()._notify(key)


@dataclass
class Faults:
    """Every fault knob of one run."""

    net: NetFaults = field(default_factory=NetFaults)
    disk: DiskFaults = field(default_factory=DiskFaults)
    metadata_latency_s_max: float = 0.0
    metadata_failure_rate: float = 0.0
    metadata_lost_reply_rate: float = 0.0

    def calm(self) -> None:
        """No more random faults (the liveness phase)."""
        self.net.loss_rate = self.net.duplicate_rate = self.net.reorder_rate = 0.0
        self.disk.io_error_rate = self.disk.journal_error_rate = 0.0
        self.metadata_failure_rate = self.metadata_lost_reply_rate = 0.0


class World:
    """See the module docstring."""

    def __init__(self, seed: int, faults: Faults, bugs: frozenset[str] = frozenset()) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults
        self.bugs = bugs
        self.net = SimNetwork(random.Random(self.rng.getrandbits(64)), faults.net)
        self.state = RecordingState()
        self.state.keys = RecordingKeySpace()
        self.state.instance_id = "simulated"
        self.bookies: list[SimBookie] = []
        self._decoded: dict[int, Versioned] = {}  # ledger id -> its metadata (ledger())
        self.journal_write_data = True  # False: BP-46 bookies (set before starting any)
        self.client_config = CLIENT_CONFIG
        self.guard_dirs = False  # autorecovery seeds: bookies take a failed disk out of service
        self.fail_stops = 0  # incarnations that stopped themselves (a journal write error)
        self._meta_faults = MemoryFaults(random.Random(self.rng.getrandbits(64)))
        self._sync_metadata_faults()

    def _sync_metadata_faults(self) -> None:
        f, m = self.faults, self._meta_faults
        m.latency_s_max, m.failure_rate = f.metadata_latency_s_max, f.metadata_failure_rate
        m.lost_reply_rate = f.metadata_lost_reply_rate

    def calm_rates_changed(self) -> None:
        """Take up new metadata fault rates set on :attr:`faults`."""
        self._sync_metadata_faults()

    def calm(self) -> None:
        """Heal partitions and slow nodes, stop random faults."""
        self.faults.calm()
        self._sync_metadata_faults()
        self.net.heal()

    def metadata_store(self) -> MemoryMetadataStore:
        """A store for one process, on the shared state, with the run's injected faults."""
        rng = random.Random(self.rng.getrandbits(64))
        return MemoryMetadataStore(self.state, METADATA_CONFIG, rng=rng, faults=self._meta_faults)

    def add_bookie(self, rack: str | None = None) -> SimBookie:
        bookie = SimBookie(self, len(self.bookies), rack)
        self.bookies.append(bookie)
        return bookie

    def bookie_at(self, address: str) -> SimBookie | None:
        for bookie in self.bookies:
            if bookie.address == address:
                return bookie
        return None

    def client(self, name: str, config: ClientConfig | None = None) -> BookKeeper:
        """A client process ``name`` (close it with :func:`close_client`)."""
        config = config or self.client_config
        rng = random.Random(self.rng.getrandbits(64))
        pool = BookiePool(self.net.view(name), config, rng)
        ctx = ClientContext(config, self.metadata_store(), pool, rng, PlacementPolicy(), self.bugs,
                            wall_clock_ms=_loop_clock_ms)  # fmt: skip
        return BookKeeper(ctx)

    def ledger(self, ledger_id: int) -> Versioned | None:
        """The current metadata of a ledger, read directly (no faults)."""
        found = self.state.ledgers.get(ledger_id)
        if found is None:
            return None
        cached = self._decoded.get(ledger_id)
        if cached is None or cached.version != found[1]:  # decode each version once
            cached = self._decoded[ledger_id] = Versioned(
                LedgerMetadata.from_json_bytes(found[0]), found[1]
            )
        return cached


async def close_client(bk: BookKeeper) -> None:
    """Shut a simulated client down (what ``BookKeeper.connect`` does on exit)."""
    await bk._shutdown()
    await bk.ctx.metadata.close()


class SimBookie:
    """One bookie node: its durable disk and the running incarnation, if any."""

    def __init__(self, world: World, index: int, rack: str | None = None) -> None:
        self.world = world
        self.rack = rack  # network location (autorecovery seeds place by rack)
        self.lost = False  # lost for good: never restarted, its disk gone
        self.name = f"bookie-{index}"
        self.address = f"{self.name}:3181"
        self.disk = NodeDisk()
        self.bookie: Bookie | None = None
        self.storage: SimStorage | None = None
        self.incarnation = 0
        self._after_crash: MemoryEngine | None = None

    @property
    def up(self) -> bool:
        """Running: started and not stopped by its own failure (fail-stop, e.g. its journal)."""
        return self.bookie is not None and self.bookie.failure is None

    def config(self) -> BookieConfig:
        return BookieConfig(
            listen=self.address,
            journal_dir=f"/{self.name}/journal",
            ledger_dirs=(f"/{self.name}/ledgers",),
            engine="memory",
            checkpoint_interval_s=self.world.rng.uniform(0.5, 3.0),
            disk_check_interval_s=3600.0,
            lease_ttl_s=2,
            handshake_timeout_s=2.0,
            shutdown_timeout_s=5.0,
            metadata_uri="memory://simulated",
            rack=self.rack,
            journal_write_data=self.world.journal_write_data,
            data_integrity_check_interval_s=0.5,
            # GC passes run during the simulation: the checkers then see that deleting the
            # data of truncated logs' ledgers never touches a live one.
            gc_interval_s=1.5,
            # Not simulated (yet): the scrubber runs only when asked, no ledger records (their
            # metadata reads would change every seed's schedule).
            scrub_interval_s=0.0,
            ledger_records=False,
            # Every read on the loop (the simulated engines answer from memory anyway): a read
            # thread's wall time would reach the schedule (sim/loop.py).
            read_threads=0,
        )

    async def start(self) -> None:
        """Boot a new incarnation from the disk (replaying its journal).

        Raises:
            Exception: whatever the bookie's boot raises (the caller retries later).
        """
        if self.bookie is not None:
            await self._reap()
        assert self.bookie is None, f"{self.name} is running"
        world = self.world
        storage_rng = random.Random(world.rng.getrandbits(64))
        config = self.config()  # drawn after the storage's rng, as before
        storage = SimStorage(self.disk, storage_rng, world.faults.disk, world.guard_dirs, config)
        # A journal failure stops the bookie (fail-stop): the process is as good as gone at
        # once; its clean stop closes connections in set order, which no seed fixes.
        storage.on_journal_failure = partial(world.net.kill_node, self.name)
        bookie = Bookie(
            config,
            network=world.net.view(self.name),
            storage=storage,
            metadata=world.metadata_store(),
            rng=random.Random(world.rng.getrandbits(64)),
            bugs=world.bugs & BOOKIE_BUGS,
            wall_clock_ms=_loop_clock_ms,  # virtual time: tombstone ages replay exactly
        )
        try:
            await bookie.start()
        except BaseException:
            bookie.abort()
            storage.crash(power_loss=False)
            raise
        self.bookie, self.storage = bookie, storage
        self.incarnation += 1
        self._after_crash = None

    async def _reap(self) -> None:
        """The incarnation stopped itself after a failure: once its stop has ended, the
        process is gone (as after ``kill -9``: the page cache keeps what it wrote)."""
        assert self.bookie is not None and self.storage is not None
        assert self.bookie.failure is not None, f"{self.name} is running"
        await self.bookie.closed.wait()
        self.world.fail_stops += 1
        self.world.net.kill_node(self.name)
        self.storage.crash(power_loss=False)
        self.bookie = self.storage = None

    def crash(self, *, power_loss: bool) -> None:
        """``kill -9`` (keeps what reached the page cache) or a power loss (may lose it). A
        bookie whose disk failed cannot boot again: it is lost."""
        assert self.bookie is not None and self.storage is not None
        self.lost = self.lost or self.disk.failed
        self.world.net.kill_node(self.name)
        self.bookie.abort()
        self.storage.crash(power_loss=power_loss)
        self.bookie = self.storage = None

    async def stop(self) -> None:
        """Clean shutdown."""
        if self.bookie is not None:
            await self.bookie.stop()
            self.bookie = self.storage = None

    def lose(self) -> None:
        """Lost for good (BP-31): the process dies and its disks are gone; never restarted."""
        if self.up:
            self.crash(power_loss=False)
        self.lost = True
        self.disk = NodeDisk()
        self._after_crash = None

    def fail_disk(self) -> None:
        """The ledger disk dies under the running bookie (BP-31): EIO on every engine call."""
        self.disk.failed = True
        if self.storage is not None and self.storage.faulty is not None:
            self.storage.faulty.dead = True

    def stored(self, ledger_id: int, entry_id: int) -> bytes | None:
        """God's view: the payload this bookie holds (or will hold after its restart)."""
        if self.lost or self.disk.failed:
            return None
        if self.storage is not None:
            record = self.storage.engine.get_entry(ledger_id, entry_id)
        else:
            if self._after_crash is None:
                self._after_crash = _restart_view(self.disk)
            record = self._after_crash.get_entry(ledger_id, entry_id)
        if record is None:
            return None
        return unpack_entry_record(record)[3]

    def in_limbo(self) -> bool:
        """Whether the running bookie still has ledgers in limbo (not yet repaired)."""
        return self.bookie is not None and bool(self.bookie.handler.limbo_ledgers())

    def forget_view(self) -> None:
        self._after_crash = None


def _restart_view(disk: NodeDisk) -> MemoryEngine:
    """What an engine on ``disk`` holds after replaying its journal (without changing it)."""
    copy = MemoryDisk(
        {lid: dict(es) for lid, es in disk.engine.entries.items()}, dict(disk.engine.ledgers)
    )
    engine = MemoryEngine(copy)
    replay_into(engine, iter(disk.journal))
    return engine


async def settle(seconds: float) -> None:
    """Let virtual time pass."""
    await asyncio.sleep(seconds)


def _loop_clock_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)
