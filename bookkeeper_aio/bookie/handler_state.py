"""The request handler's state and what every path shares: the cache of ledger states, the ledger
changes that are not adds (limbo, held adds, forgetting a deleted ledger, copies from the
integrity check), the fence, and how a failed request is answered (bookie/handler.py says how
the handler works as a whole)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from time import perf_counter
from typing import Protocol

from ..config import BookieConfig
from ..digest import MASTER_KEY_BYTES
from ..engine import Engine, LedgerInfo
from ..errors import JournalFailedError, StatusCode
from ..histogram import new_histogram, no_clock
from ..protocol import (
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BookieInfoResponse,
    ErrorResponse,
    LedgerRecordsRequest,
    LedgerRecordsResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    Message,
    MultiAddRequest,
    MultiAddResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    ScrubRequest,
    WriteLacRequest,
    WriteLacResponse,
    WriteLafrRequest,
    WriteLafrResponse,
)
from .deferred import DeferredCopies
from .journal import REC_ENTRY, REC_FENCE, REC_LIMBO, Body
from .ledger_state import LedgerState, LedgerView
from .long_poll import Peer
from .read_pool import ReadPool
from .records import entry_body, ledger_body, limbo_body
from .trace import AddTrace

log = logging.getLogger(__name__)

Reply = Callable[[Message], None]
OK = StatusCode.OK
UNKNOWN_KEY = b""  # the master key of a ledger entered into limbo without local data


class JournalSink(Protocol):
    """What the handler needs from the journal (``journal.Journal``; the simulator's own)."""

    def append(
        self, rtype: int, body: Body, callback: Callable[[BaseException | None], None]
    ) -> None: ...


class HandlerState:
    """The state the request paths share (RequestHandler is built of it and of the paths
    that use it: handler_adds.py, handler_reads.py, handler_audits.py)."""

    def __init__(
        self,
        engine: Engine,
        journal: JournalSink,
        config: BookieConfig,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.journal = journal
        self.config = config
        self.read_only = config.force_read_only
        self.disk_space = (0, 0)  # (free, total) bytes, refreshed by the disk monitor
        self.parked = 0  # long polls parked, in all
        self.counters: Counter[str] = Counter()
        # Seconds from an add request to its durable answer; of a plain read (/metrics).
        timed = config.metrics_latency
        self.add_latency = new_histogram(timed)
        self.read_latency = new_histogram(timed)
        self._clock = perf_counter if timed else no_clock
        self._ledgers: dict[int, LedgerState] = {}  # oldest loaded first (evicted first)
        # Ledgers deleted by GC, oldest first (bounded): their fence went with their data.
        self._deleted: dict[int, bool] = {}  # deleted ledger -> copies of it welcome (forget)
        self._held_adds: set[int] = set()  # ledgers whose adds are refused for now (hold_adds)
        self._on_fatal = on_fatal
        # Set by the bookie: a ledger learned of (its metadata is to be read), the scrubber's
        # state as a ScrubResponse's counters (``start``: run a pass now).
        self.on_new_ledger: Callable[[int], None] | None = None
        self.scrub_control: Callable[[bool], Sequence[int]] | None = None
        self.trace: AddTrace | None = None  # benchmarks only: timestamps of every add
        # Set by the bookie: the engine's writes have run ahead of its background work
        # (Engine.write_pressure), looked at every engine_pressure_check_bytes written.
        self.on_engine_pressure: Callable[[], None] | None = None
        self._unchecked_bytes = 0
        # Copies stored without the journal (ADD_FLAG_DEFERRED_SYNC, bookie/deferred.py) and
        # the engine sync a listing of their ledger waits for: the bookie's checkpoint, which
        # tells ``deferred`` when it begins and ends, and skips itself if the predicate it is
        # given says False when its turn comes (None: ``engine.sync()`` inline).
        self.deferred = DeferredCopies()
        self.sync_engine: Callable[[Callable[[], bool]], Awaitable[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = ReadPool(config.read_threads, config.read_queue_max)
        self._inline = Peer()  # the peer of a request handed in without one

    def _failed(self, request: Message, reply: Reply, exc: Exception) -> None:
        """An engine, journal or programming failure on a request: answer IO_ERROR (never
        crash the connection); a journal failure also stops the bookie."""
        reply(error_response(request, StatusCode.IO_ERROR))
        self._note_failure(request, exc)

    def _note_failure(self, request: Message, exc: Exception) -> None:
        """Count and log a failure on a request; a journal failure also stops the bookie."""
        self.counters["io_errors"] += 1
        if isinstance(exc, OSError | JournalFailedError):
            log.error("I/O error handling %s: %s", type(request).__name__, exc)
        else:
            log.exception("failure handling %s", type(request).__name__)
        if isinstance(exc, JournalFailedError) and self._on_fatal is not None:
            self._on_fatal(exc)

    def statistics(self) -> dict[str, int | bool]:
        """Counters, cached ledgers, parked long polls, read-only state, the read threads'
        figures."""
        return {
            **self.counters,
            "ledgers_cached": len(self._ledgers),
            "long_polls_parked": self.parked,
            "read_only": self.read_only,
            **self.reads.statistics(),
        }

    # --- ledger state ---------------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerState | None:
        """The cached state of a ledger, loaded from the engine on first use; None if unknown."""
        state = self._ledgers.get(ledger_id)
        if state is None:
            info = self.engine.get_ledger(ledger_id)
            if info is None:
                return None
            last = self.engine.last_entry_id(ledger_id)
            record = self.engine.get_entry(ledger_id, last) if last >= 0 else None
            state = LedgerState.load(ledger_id, info, (last, record) if record else None)
            self._remember(state)
        return state

    def _new_ledger(self, ledger_id: int, master_key: bytes, view: LedgerView) -> LedgerState:
        state = LedgerState(ledger_id, master_key, view)
        self._put_info(ledger_id, state.info())  # first: a failure leaves no trace
        self._remember(state)
        if self.on_new_ledger is not None:
            self.on_new_ledger(ledger_id)
        return state

    def _put_info(self, ledger_id: int, info: LedgerInfo) -> None:
        """Store a ledger's info, keeping its ledger record (module docstring)."""
        old = self.engine.get_ledger(ledger_id)
        if old is not None and old.record:
            info = info.replace(record=old.record)
        self.engine.put_ledger(ledger_id, info)

    def set_record(self, ledger_id: int, record: bytes) -> bool:
        """Keep ``record`` as the ledger's record; False if the ledger is not here or already
        has it. Not journaled: a record lost in a crash is read again by the next scrub pass."""
        info = self.engine.get_ledger(ledger_id)
        if info is None or info.record == record:
            return False
        self.engine.put_ledger(ledger_id, info.replace(record=record))
        return True

    def _remember(self, state: LedgerState) -> None:
        """Cache ``state``; past ``ledger_cache_max`` drop the oldest one that is evictable
        (a busy one goes to the back, so a scan is amortized over the insertions)."""
        ledgers = self._ledgers
        ledgers[state.ledger_id] = state
        for _ in range(len(ledgers) - self.config.ledger_cache_max):
            for _ in range(len(ledgers)):
                ledger_id = next(iter(ledgers))
                old = ledgers.pop(ledger_id)
                if old.evictable and old is not state:
                    self.counters["ledgers_evicted"] += 1
                    break
                ledgers[ledger_id] = old

    def limbo_ledgers(self) -> list[tuple[int, bytes]]:
        """(ledger id, master key) of every ledger in limbo (the key may be ``UNKNOWN_KEY``)."""
        found = []
        for ledger_id in self.engine.ledgers():
            state = self.ledger(ledger_id)
            if state is not None and state.view is LedgerView.LIMBO:
                found.append((ledger_id, state.master_key))
        return found

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the engine has the entry (repair checks)."""
        return self.engine.get_entry(ledger_id, entry_id) is not None

    def store_copy(self, ledger_id: int, entry_id: int, record: bytes, done: Callable) -> None:
        """Store an entry copied from a peer by the integrity check; ``done(exc)`` once it is
        as durable as an add would be."""
        if self.ledger(ledger_id) is None:
            self._new_ledger(ledger_id, UNKNOWN_KEY, LedgerView.FENCED)
        self.engine.put_entry(ledger_id, entry_id, record)
        if self.config.journal_write_data:
            self.journal.append(REC_ENTRY, entry_body(ledger_id, entry_id, record), done)
        else:
            done(None)

    def _key_ok(self, state: LedgerState, key: bytes | None) -> bool:
        """Does ``key`` match the ledger's master key? A ledger put in limbo at boot after its
        data was lost has no key yet (``UNKNOWN_KEY``): the first client that proves one (a
        fence, a recovery add) teaches it, as BookKeeper's empty-key limbo records do."""
        if state.master_key == UNKNOWN_KEY and key is not None and len(key) == MASTER_KEY_BYTES:
            self._put_info(state.ledger_id, state.info(master_key=key))
            state.master_key = key
        return key == state.master_key

    def set_limbo(self, ledger_id: int, master_key: bytes, limbo: bool, done: Callable) -> None:
        """Enter or leave limbo (BP-46); ``done(exc)`` once the change is durable.

        Entering limbo also fences: the ledger's writer must not add to a bookie that may
        have lost entries."""
        state = self.ledger(ledger_id) or self._new_ledger(ledger_id, master_key, LedgerView.LIMBO)
        target = LedgerView.LIMBO if limbo else LedgerView.FENCED
        self._put_info(ledger_id, state.info(target))
        state.move_to(target)
        state.wake_waiters()
        self.journal.append(REC_LIMBO, limbo_body(ledger_id, state.master_key, limbo), done)

    def hold_adds(self, ledger_id: int, held: bool) -> None:
        """Refuse adds to the ledger (as to a deleted one) while ``held``: the garbage
        collector's last check of an extra copy (gc.py), so that no copy is acknowledged
        between that check and the delete."""
        if held:
            self._held_adds.add(ledger_id)
        else:
            self._held_adds.discard(ledger_id)

    def forget(self, ledger_id: int, copies_welcome: bool = False) -> None:
        """Drop a deleted ledger from the cache (the engine deletes its data) and remember
        that it was deleted: adds to it are refused from now on (see ``_store``), and so are
        recovery adds unless ``copies_welcome``: the GC deleted an extra copy of a ledger that
        lives on, which autorecovery may copy here again (gc.py)."""
        state = self._ledgers.pop(ledger_id, None)
        if state is not None:
            state.move_to(LedgerView.DELETED)
            state.wake_waiters()
        self._deleted.pop(ledger_id, None)
        self._deleted[ledger_id] = copies_welcome
        while len(self._deleted) > self.config.deleted_ledgers_remembered_max:
            del self._deleted[next(iter(self._deleted))]

    # --- fence ----------------------------------------------------------------------------

    def _fence(self, ledger_id: int, master_key: bytes | None, then: Callable[[int], None]) -> None:
        """Fence the ledger durably, then call ``then(status)``."""
        if master_key is None or len(master_key) != MASTER_KEY_BYTES:
            then(StatusCode.BAD_REQUEST)
            return
        state = self.ledger(ledger_id)
        if state is None:  # a fence of an unknown ledger records it as fenced
            state = self._new_ledger(ledger_id, master_key, LedgerView.FENCED)
            state.fence_durable = False
        elif not self._key_ok(state, master_key):
            then(StatusCode.UNAUTHORIZED)
            return
        elif not state.fenced:
            self._put_info(ledger_id, state.info(LedgerView.FENCED))
            state.move_to(LedgerView.FENCED)
            state.fence_durable = False
            state.wake_waiters()  # tailing readers learn at once that the writer is gone
        self.counters["fences"] += 1
        if state.fence_durable:
            then(OK)
            return

        def durable(exc: BaseException | None) -> None:
            if exc is None:
                state.fence_durable = True
            then(OK if exc is None else StatusCode.IO_ERROR)

        # Another record even if one is pending: its callback comes after the first's.
        self.journal.append(REC_FENCE, ledger_body(ledger_id, master_key), durable)


def _ignore(exc: BaseException | None) -> None:
    """Callback for records whose durability a later record's callback already implies."""


def error_response(request: Message, status: int) -> Message:
    """A response of the request's own type carrying only an error status."""
    rid = request.request_id
    if isinstance(request, AddRequest):
        return AddResponse(rid, status, request.ledger_id, request.entry_id)
    if isinstance(request, AddBatchRequest):
        return AddBatchResponse(rid, status, request.ledger_id, [])
    if isinstance(request, MultiAddRequest):
        return MultiAddResponse(rid, status, [])
    if isinstance(request, ReadRequest):
        return ReadResponse(rid, status, request.ledger_id, request.entry_id, *[None] * 4)
    if isinstance(request, ReadLacRequest):
        return ReadLacResponse(rid, status, request.ledger_id, None, -1)
    if isinstance(request, WriteLacRequest):
        return WriteLacResponse(rid, status, request.ledger_id)
    if isinstance(request, WriteLafrRequest):
        return WriteLafrResponse(rid, status, request.ledger_id)
    if isinstance(request, ListEntriesRequest):
        return ListEntriesResponse(rid, status, request.ledger_id, [], -1)
    if isinstance(request, LedgerRecordsRequest):
        return LedgerRecordsResponse(rid, status, [], -1)
    if isinstance(request, ReadBatchRequest):
        return ReadBatchResponse(rid, status, request.ledger_id, request.first_entry_id, b"",
                                 OK, None)  # fmt: skip
    if isinstance(request, ScrubRequest):
        return ErrorResponse(rid, status, "scrub failed")
    return BookieInfoResponse(rid, status, 0, 0, True, "")
