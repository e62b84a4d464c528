"""The bookie's request processing: one method per operation, callbacks on the hot path.

Theory of operation
-------------------
:meth:`RequestHandler.handle` takes a decoded request and a ``reply`` callable and calls
``reply`` exactly once, now or later. Nothing here touches sockets; the connection
(``server.py``) owns framing, limits and output. Time enters only through the event loop's
``call_later`` (long-poll timeouts), so the simulator runs this code unchanged; the latency
histograms read ``perf_counter``, for reporting only (histogram.py).

Durability: an add is written to the engine (its write buffer; fast, synchronous) and appended
to the journal; the reply is sent from the journal's callback, i.e. after the fdatasync of
the batch holding it. The same holds for a fence, a ledger's master key and an explicit LAC.
The journal is ordered, so one record's callback implies every earlier record is durable.
Autorecovery's copies with ``ADD_FLAG_DEFERRED_SYNC`` are the exception: stored and answered
at once, durable at the next engine sync, which a listing of their ledger waits for
(bookie/deferred.py).

Checks on an add, in this order (so that nothing is stored unless every check passed):
read-only (recovery adds pass), the end-to-end digest (BP-31), the master key, the fence
(recovery adds pass). The order matches BookKeeper's ``BookieImpl.addEntry`` except that the
digest comes first: a corrupt frame must not create a ledger as a side effect. A
``MultiAddRequest`` is its parts handled one after another exactly so, answered once the last
part has its answer (the stored entries of all its parts are journaled as one record, whose
callback answers them all); at most ``multi_add_parts_max``
parts and ``request_entries_max`` entries in all (a frame's work is bounded, not just its
bytes).

Failures: any exception on a request path (an engine's, a bug's) becomes an error answer
(IO_ERROR), never a dropped connection; a journal failure also stops the bookie (fail-stop).
The ledger cache changes only after the engine took the change (a fence that failed to reach
the engine is not remembered as fenced). Reads whose answer comes later (after a fence is
durable, a long poll's) are answered through their peer's ``defer`` (long_poll.py), which a
connection delays while its client does not read.

The cache of ledger states holds at most ``ledger_cache_max`` of them: past it the least
recently loaded one with no parked read and no fence being synced is dropped (the engine has
everything needed to load it again).

This handler keeps no per-request task: at 100k adds/s a task per add costs more than the add.
(A listing that waits for an engine sync is one, rare: only after deferred-sync copies.)

Beside the protocol's state, each ledger's ``LedgerInfo`` carries its *ledger record* (the
ledger's metadata as the bookie last read it, for rebuilding a lost metadata store: BP-31,
``metadata/ledger_record.py``). It is never part of a state change: every info this handler
writes keeps the stored record (:meth:`RequestHandler._put_info`), and only
:meth:`RequestHandler.set_record` changes it. ``on_new_ledger`` tells the bookie of a ledger
it just learned of (so it reads its metadata); SCRUB and LEDGER_RECORDS are the operator's
requests (``shell scrub``, ``shell recover-metadata``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from time import perf_counter
from typing import Any, Protocol

from ..config import BookieConfig
from ..digest import (
    LAC_RECORD_ENTRY_ID,
    MASTER_KEY_BYTES,
    LacProof,
    header_digest,
    lac_digest,
    payload_digest,
    unpack_entry_record,
)
from ..engine import Engine, LedgerInfo
from ..errors import JournalFailedError, StatusCode
from ..histogram import new_histogram, no_clock
from ..metadata.ledger_record import Held, pack_held
from ..protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    INT64_MAX,
    PACKED_ENTRY_PREFIX,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BadFrame,
    BookieInfoRequest,
    BookieInfoResponse,
    CheckedEntry,
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
    ScrubResponse,
    WriteLacRequest,
    WriteLacResponse,
    WriteLafrRequest,
    WriteLafrResponse,
    add_entry_head,
    as_part,
    check_add_entries,
    multi_add_parts,
)
from .deferred import DeferredCopies
from .journal import REC_ENTRY, REC_EXPLICIT_LAC, REC_FENCE, REC_LIMBO, REC_MASTER_KEY, Body
from .ledger_state import LedgerState, LedgerView, pack_proof
from .long_poll import LongPoll, Peer
from .read_pool import BatchRead, ReadPool
from .records import (
    Journaled,
    entries_record,
    entry_body,
    ledger_body,
    ledgers_entries_record,
    limbo_body,
    packed,
)
from .trace import AddTrace, TracedReply

log = logging.getLogger(__name__)

Reply = Callable[[Message], None]
OK = StatusCode.OK
UNKNOWN_KEY = b""  # the master key of a ledger entered into limbo without local data
# Engine syncs a listing waits for at most, should copies of its ledger keep arriving (one
# worker copies a ledger at a time, so one is the rule): then it lists anyway.
LIST_SYNCS_MAX = 3


class JournalSink(Protocol):
    """What the handler needs from the journal (``journal.Journal``; the simulator's own)."""

    def append(
        self, rtype: int, body: Body, callback: Callable[[BaseException | None], None]
    ) -> None: ...


class RequestHandler:
    """Executes requests against the engine and the journal (see the module docstring)."""

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
        self._dispatch: dict[type, Callable[[Any, Reply, Peer], object]] = {
            AddRequest: self._add,
            AddBatchRequest: self._add_batch,
            MultiAddRequest: self._multi_add,
            ReadRequest: self._read,
            ReadLacRequest: self._read_lac,
            WriteLacRequest: self._write_lac,
            WriteLafrRequest: self._write_lafr,
            ListEntriesRequest: self._list_entries,
            BookieInfoRequest: self._bookie_info,
            ScrubRequest: self._scrub,
            LedgerRecordsRequest: self._ledger_records,
            ReadBatchRequest: self._read_batch,
        }

    # --- entry point --------------------------------------------------------------------

    def handle(self, request: Message, reply: Reply, peer: Peer | None = None) -> None:
        """Process one request; ``reply`` is called exactly once (maybe later). ``peer``: the
        connection it came on (its long polls, when its later answers may be produced)."""
        handler = self._dispatch.get(type(request))
        assert handler is not None, f"not a bookie request: {type(request).__name__}"
        try:
            handler(request, reply, peer or self._inline)
        except Exception as exc:  # every path answers last: nothing was answered yet
            self._failed(request, reply, exc)

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

    # --- add ------------------------------------------------------------------------------

    def _add(self, req: AddRequest, reply: Reply, peer: Peer) -> None:
        started = self._clock()
        if self.trace is not None:
            reply = TracedReply(self.trace, reply, req.ledger_id, req.entry_id, 1)
        answer, journaled = self._stage_add(req)
        self._answer_when_durable(answer, journaled, reply, started)

    def _add_batch(self, req: AddBatchRequest, reply: Reply, peer: Peer) -> None:
        """Each entry as :meth:`_add` would; one journal record for the stored ones and one
        answer once it is durable."""
        started = self._clock()
        handled = time.perf_counter() if self.trace is not None else 0.0
        entries, answer, journaled = self._stage_batch(req)
        if self.trace is not None and entries:
            reply = TracedReply(self.trace, reply, req.ledger_id, entries[0][0], len(entries),
                                handled)  # fmt: skip
        self._answer_when_durable(answer, journaled, reply, started)

    def _answer_when_durable(
        self, answer: Message, journaled: Journaled | None, reply: Reply, started: float
    ) -> None:
        """Reply ``answer`` now if there are no ``journaled`` entries to wait for, else once
        their record is durable (its stored entries IO_ERROR if the journal fails)."""
        if journaled is None:
            reply(answer)
            return

        def durable(exc: BaseException | None) -> None:
            reply(answer if exc is None else _failed_answer(answer))
            self.add_latency.observe(self._clock() - started)

        if type(reply) is TracedReply:  # before: the journal thread may take it at once
            reply.queued_now()
        self.journal.append(*entries_record(journaled), durable)

    def _stage_add(self, req: AddRequest) -> tuple[AddResponse, Journaled | None]:
        """Check and store an add: its answer once its entry is journaled (None: nothing to
        journal, the answer is final now), and the entry to journal."""
        rid, lid, eid = req.request_id, req.ledger_id, req.entry_id
        pdigest = payload_digest(req.payload)
        # The entry packed as a batch carries it, once: the engine stores it so and the
        # journal record holds it so. (The rocksdb engine packed it again: ~2 % of a bookie's
        # samples in an open loop over 100 ledgers, whose multi-adds are mostly lone adds.)
        one = add_entry_head(eid, req.lac, pdigest, req.digest, len(req.payload)) + req.payload
        record = memoryview(one)[PACKED_ENTRY_PREFIX.size :]
        intact = header_digest(lid, eid, req.lac, pdigest) == req.digest
        entry = (eid, req.lac, pdigest, req.digest, record, intact)
        statuses, journaled = self._store(lid, req.flags, req.master_key, (entry,), one)
        answer = AddResponse(rid, statuses[0], lid, eid)
        return answer, (lid, (one,)) if journaled else None

    def _stage_batch(
        self, req: AddBatchRequest, entries_max: int = 0
    ) -> tuple[list[CheckedEntry], Message, Journaled | None]:
        """Check and store an add batch: the entries it carried (none if refused whole), its
        answer once its stored entries are journaled (None: nothing to journal, the answer
        is final now), and those entries."""
        rid, lid = req.request_id, req.ledger_id
        try:
            entries_max = entries_max or self.config.request_entries_max
            entries = check_add_entries(lid, req.entries, entries_max=entries_max)
        except ValueError as exc:
            self.counters["add_bad_request"] += 1
            return [], ErrorResponse(rid, StatusCode.BAD_REQUEST, f"AddBatchRequest: {exc}"), None
        statuses, journaled = self._store(lid, req.flags, req.master_key, entries, req.entries)
        answer = AddBatchResponse(rid, _first_failure(statuses), lid, statuses)
        if not journaled:
            return entries, answer, None
        if len(journaled) == len(entries):  # the request's bytes are the record's body
            return entries, answer, (lid, (req.entries,))
        return entries, answer, (lid, packed(journaled))

    def _multi_add(self, req: MultiAddRequest, reply: Reply, peer: Peer) -> None:
        """Each part checked and stored as if it had come alone; one answer once every part
        has its own. At most ``multi_add_parts_max`` parts (else refused whole) and
        ``request_entries_max`` entries in all (the parts past it are refused).

        The parts' stored entries are journaled as one record (``REC_LEDGERS_ENTRIES``) with
        one callback. (A record, a callback, an answer object and a closure per part cost the
        bookie more than the part's entries when 100 ledgers share a request.)"""
        if len(req.parts) > self.config.multi_add_parts_max:
            self.counters["add_bad_request"] += 1
            reply(MultiAddResponse(req.request_id, StatusCode.BAD_REQUEST, []))
            return
        started = self._clock()
        parts = multi_add_parts(req)
        results: list[list[Any]] = [[] for _ in parts]
        journaled: list[Journaled] = []  # the stored entries of each part, in order
        waiting: list[tuple[int, Message]] = []  # (part, its answer once journaled)
        traced: list[tuple[int, int, int, float]] = []  # (lid, first, count, handled) of each
        entries_left = self.config.request_entries_max
        for index, part in enumerate(parts):
            reason = part.reason if type(part) is BadFrame else None
            if reason is None and entries_left <= 0:
                reason = f"more than request_entries_max {self.config.request_entries_max} entries"
            if reason is not None:
                self.counters["add_bad_request"] += 1
                results[index] = as_part(
                    ErrorResponse(req.request_id, StatusCode.BAD_REQUEST, reason)
                )
                continue
            assert type(part) is not BadFrame  # a BadFrame has its reason
            handled = time.perf_counter() if self.trace is not None else 0.0
            try:
                if type(part) is AddBatchRequest:
                    entries, answer, stored = self._stage_batch(part, entries_left)
                    entries_left -= len(entries) or 1
                    span = (entries[0][0], len(entries)) if entries else (0, 0)
                else:
                    assert type(part) is AddRequest  # multi_add_parts: an add or a batch
                    entries_left -= 1
                    answer, stored = self._stage_add(part)
                    span = (part.entry_id, 1)
            except Exception as exc:
                self._note_failure(part, exc)
                results[index] = as_part(error_response(part, StatusCode.IO_ERROR))
                continue
            if stored is None:
                results[index] = as_part(answer)
                continue
            journaled.append(stored)
            waiting.append((index, answer))
            if self.trace is not None:
                traced.append((part.ledger_id, *span, handled))
        if not journaled:
            reply(MultiAddResponse(req.request_id, OK, results))
            return
        queued = time.perf_counter() if self.trace is not None else 0.0

        def durable(exc: BaseException | None) -> None:
            for index, answer in waiting:
                results[index] = as_part(answer if exc is None else _failed_answer(answer))
            if self.trace is not None:
                for lid, first, count, handled in traced:
                    self.trace.request(lid, first, count, handled, queued)
            reply(MultiAddResponse(req.request_id, OK, results))
            self.add_latency.observe_many(self._clock() - started, len(waiting))

        try:
            self.journal.append(*ledgers_entries_record(journaled), durable)
        except Exception as exc:  # the journal failed: no part is known durable
            self._note_failure(req, exc)
            durable(exc)

    def _store(
        self,
        lid: int,
        flags: int,
        key: bytes,
        entries: Sequence[tuple[int, int, int, int, bytes | memoryview, bool]],
        packed: bytes | None = None,
    ) -> tuple[list[StatusCode], list[tuple[int, bytes | memoryview]]]:
        """Check ``(entry_id, lac, payload_digest, digest, record, intact)`` entries of one
        ledger (``intact``: the digests matched, protocol.check_add_entries) and put those
        that pass into the engine (``packed``: the entries packed as an add batch carries
        them, which the engine gets too when every entry passed). Returns each
        entry's status and the (entry id, record) pairs that still have to be journaled
        before the answer (none without data journaling, nor for deferred-sync copies).

        Per-entry checks come first (ids, the writer's LAC below its entry, read-only, the
        digests), then the ledger's (its key, the fence): a batch whose every digest is wrong
        creates no ledger. A batch is checked as a whole before anything is stored, which is
        what checking its entries one by one would give: nothing between them can change
        the ledger's state.
        """
        recovery = flags & ADD_FLAG_RECOVERY
        deferred = flags & ADD_FLAG_DEFERRED_SYNC
        if len(key) != MASTER_KEY_BYTES or (deferred and not recovery):
            # ids: the codec refuses a ledger id < 0; a writer's add is durable when answered
            return self._refused([StatusCode.BAD_REQUEST] * len(entries)), []
        refuse_all = StatusCode.READ_ONLY if self.read_only and not recovery else None
        statuses: list[StatusCode] = []
        stored: list[tuple[int, bytes | memoryview]] = []  # (entry id, record) of those passed
        best: tuple[int, int, int, int] | None = None  # the passing entry with the highest LAC
        for eid, lac, pdigest, digest, record, intact in entries:
            if eid < 0 or (lac >= eid and not recovery):  # a writer's LAC is below its entry
                statuses.append(StatusCode.BAD_REQUEST)
            elif refuse_all is not None:
                statuses.append(refuse_all)
            elif not intact:
                statuses.append(StatusCode.BAD_DIGEST)
            else:
                statuses.append(OK)
                stored.append((eid, record))
                if best is None or lac > best[1]:
                    best = (eid, lac, pdigest, digest)
        if best is None:
            return self._refused(statuses), []
        state = self.ledger(lid)
        refusal = None
        gone = state is None and lid in self._deleted and not (recovery and self._deleted[lid])
        if gone or (self._held_adds and lid in self._held_adds):
            # A writer that outlived its ledger: the ledger was closed (its fence, deleted
            # with the data, had refused this add) and then deleted. Creating it again would
            # acknowledge an entry of a closed ledger (NoDivergenceBetweenClientAndMetaData).
            # Or the GC is about to delete this bookie's extra copy of it (hold_adds). A
            # copy of a ledger whose extra copy was deleted here is welcome: it lives on.
            refusal = StatusCode.NO_SUCH_LEDGER if recovery else StatusCode.FENCED
            return self._refused([refusal if s is OK else s for s in statuses]), []
        if state is None:
            state = self._new_ledger(lid, key, LedgerView.ACTIVE)
            self.journal.append(REC_MASTER_KEY, ledger_body(lid, key), _ignore)
        elif key != state.master_key and not self._key_ok(state, key):
            refusal = StatusCode.UNAUTHORIZED
        elif state.view is not LedgerView.ACTIVE and state.fenced and not recovery:
            refusal = StatusCode.FENCED
        if refusal is not None:
            return self._refused([refusal if s is OK else s for s in statuses]), []
        if len(stored) < len(statuses):
            self._refused(statuses)
            packed = None
        self.engine.put_entries(lid, stored, packed, bool(recovery), bool(deferred))
        self.counters["adds"] += len(stored)
        if self.on_engine_pressure is not None:
            self._unchecked_bytes += (
                len(packed) if packed is not None else sum(len(r) for _, r in stored)
            )
            if self._unchecked_bytes >= self.config.engine_pressure_check_bytes:
                self._unchecked_bytes = 0
                if self.engine.write_pressure():
                    self.on_engine_pressure()
        if state.offer_lac(LacProof(*best)) and state.waiters:
            state.wake_waiters()
        if deferred:  # durable at the next engine sync, which a listing waits for
            self.deferred.stored(lid)
            self.counters["copies_deferred"] += len(stored)
            return statuses, []
        # BP-46 without the journal: the replicas and the limbo protocol make up for a crash
        # that loses what the engine had not synced.
        return statuses, stored if self.config.journal_write_data else []

    def _refused(self, statuses: list[StatusCode]) -> list[StatusCode]:
        for status in statuses:
            if status is not OK:
                self.counters[f"add_{status.name.lower()}"] += 1
        return statuses

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

    # --- reads ----------------------------------------------------------------------------

    def _read(self, req: ReadRequest, reply: Reply, peer: Peer) -> None:
        self.counters["reads"] += 1
        if req.flags & READ_FLAG_FENCE:

            def fenced(status: int) -> None:
                if status == OK:  # maybe later (the fence's sync): when the peer can take it
                    peer.defer(partial(self._read_entry, req, reply))
                else:
                    reply(ReadResponse(req.request_id, status, req.ledger_id, req.entry_id,
                                       None, None, None, None))  # fmt: skip

            self._fence(req.ledger_id, req.master_key, fenced)
        elif req.flags & READ_FLAG_LONG_POLL:
            self._long_poll(req, reply, peer)
        else:
            self._read_entry(req, reply, started=self._clock())

    def _read_entry(
        self,
        req: ReadRequest,
        reply: Reply,
        *,
        missing_ok: bool = False,
        started: float | None = None,
    ) -> None:
        """Answer a read of one entry, now or from a read thread (read_pool.py); ``started``:
        when a plain read arrived (its latency is observed once answered)."""
        rid, lid, eid = req.request_id, req.ledger_id, req.entry_id
        state = self.ledger(lid)
        if state is None:
            reply(ReadResponse(rid, StatusCode.NO_SUCH_LEDGER, lid, eid, None, None, None, None))
            return
        if req.master_key is not None and not self._key_ok(state, req.master_key):
            reply(ReadResponse(rid, StatusCode.UNAUTHORIZED, lid, eid, None, None, None, None))
            return

        def answer(record: bytes | None, exc: Exception | None) -> None:
            try:
                entry = unpack_entry_record(record) if record is not None else None
            except Exception as bad:
                exc = bad
            if exc is not None:
                self.counters["io_errors"] += 1
                log.error("error reading entry %d of ledger %d: %r", eid, lid, exc)
                reply(ReadResponse(rid, StatusCode.IO_ERROR, lid, eid, None, None, None, None))
            elif entry is None:
                if missing_ok:
                    status = OK
                elif state.view is LedgerView.LIMBO:
                    status = StatusCode.UNKNOWN  # BP-46: the entry may have existed
                else:
                    status = StatusCode.NO_SUCH_ENTRY
                reply(ReadResponse(rid, status, lid, eid, None, None, None, state.lac_proof))
            else:
                lac, _pdigest, digest, payload = entry
                reply(ReadResponse(rid, OK, lid, eid, lac, payload, digest, state.lac_proof))
            if started is not None:
                self.read_latency.observe(self._clock() - started)

        # (also runs from callbacks — fence durable, long-poll wake-up — so it answers
        # whatever the engine does)
        engine = self.engine
        ready = partial(engine.can_read_now, lid, eid)
        self.reads.read(lid, ready, partial(engine.get_entry, lid, eid), answer)

    def _read_batch(self, req: ReadBatchRequest, reply: Reply, peer: Peer) -> None:
        """Consecutive entries in one answer, as ReadRequests would find them one by one
        (a fencing one fences first); at most ``request_entries_max`` entries and
        ``frame_bytes_max / 2`` bytes, whatever the request asks."""
        self.counters["read_batches"] += 1
        if req.max_count < 1 or req.max_bytes < 1 or req.flags & ~READ_FLAG_FENCE:
            self.counters["read_bad_request"] += 1
            reply(ReadBatchResponse(req.request_id, StatusCode.BAD_REQUEST, req.ledger_id,
                                    req.first_entry_id, b"", OK, None))  # fmt: skip
            return
        if req.flags & READ_FLAG_FENCE:

            def fenced(status: int) -> None:
                if status == OK:  # maybe later (the fence's sync): when the peer can take it
                    peer.defer(partial(self._read_entries, req, reply))
                else:
                    reply(ReadBatchResponse(req.request_id, status, req.ledger_id,
                                            req.first_entry_id, b"", OK, None))  # fmt: skip

            self._fence(req.ledger_id, req.master_key, fenced)
        else:
            self._read_entries(req, reply)

    def _read_entries(self, req: ReadBatchRequest, reply: Reply) -> None:
        rid, lid, first = req.request_id, req.ledger_id, req.first_entry_id
        state = self.ledger(lid)
        if state is None or (
            req.master_key is not None and not self._key_ok(state, req.master_key)
        ):
            status = StatusCode.NO_SUCH_LEDGER if state is None else StatusCode.UNAUTHORIZED
            reply(ReadBatchResponse(rid, status, lid, first, b"", OK, None))
            return
        # (ids stay int64: a request may name the last one)
        count = min(req.max_count, self.config.request_entries_max, INT64_MAX - first + 1)
        budget = min(req.max_bytes, self.config.frame_bytes_max // 2)
        gathered = BatchRead(self.engine, lid, first, first + count, budget)

        def answer(_: object, exc: Exception | None) -> None:
            if exc is not None and gathered.error is None:  # (gather catches the engine's)
                gathered.error = exc
            end = OK
            if gathered.error is not None:
                self.counters["io_errors"] += 1
                log.error("error reading entry %d of ledger %d: %r", gathered.next_id, lid,
                          gathered.error)  # fmt: skip
                end = StatusCode.IO_ERROR
            elif gathered.missing:  # as _read_entry: in limbo BP-46's entry may have existed
                limbo = state.view is LedgerView.LIMBO
                end = StatusCode.UNKNOWN if limbo else StatusCode.NO_SUCH_ENTRY
            self.counters["reads"] += len(gathered.parts) // 2
            reply(ReadBatchResponse(rid, OK, lid, first, b"".join(gathered.parts), end,
                                    state.lac_proof))  # fmt: skip

        # what the engine has in memory on the loop; from the first entry that may wait on
        # the disk, the rest in a read thread
        ready = partial(gathered.gather, now_only=True)
        self.reads.read(lid, ready, partial(gathered.gather, now_only=False), answer)

    def _long_poll(self, req: ReadRequest, reply: Reply, peer: Peer) -> None:
        """Answer once the LAC passes ``previous_lac``, the ledger is fenced, or time is up
        (long_poll.py)."""
        state = self.ledger(req.ledger_id)
        if state is None or LongPoll.ready(state, req.previous_lac):
            self._read_entry(req, reply, missing_ok=state is not None)
            return
        if (
            self.parked >= self.config.long_poll_parked_max
            or len(peer.long_polls) >= self.config.connection_long_polls_max
        ):
            self.counters["long_polls_refused"] += 1
            reply(ReadResponse(req.request_id, StatusCode.TOO_MANY_REQUESTS, req.ledger_id,
                               req.entry_id, None, None, None, None))  # fmt: skip
            return
        timeout_ms = max(0, min(req.timeout_ms, self.config.long_poll_timeout_ms_max))
        answer = partial(self._read_entry, req, reply, missing_ok=True)
        LongPoll(self, state, req.previous_lac, timeout_ms / 1000, answer, peer)

    def _read_lac(self, req: ReadLacRequest, reply: Reply, peer: Peer) -> None:
        rid, lid = req.request_id, req.ledger_id

        def answer(status: int) -> None:
            try:  # also runs from the fence's journal callback: answer whatever happens
                respond(status)
            except Exception as exc:
                self._failed(req, reply, exc)

        def respond(status: int) -> None:
            state = self.ledger(lid) if status == OK else None
            if state is None:
                status = status if status != OK else StatusCode.NO_SUCH_LEDGER
                reply(ReadLacResponse(rid, status, lid, None, -1))
            elif req.master_key is not None and not self._key_ok(state, req.master_key):
                reply(ReadLacResponse(rid, StatusCode.UNAUTHORIZED, lid, None, -1))
            elif state.view is LedgerView.LIMBO:  # BP-46: its LAC may be too low: unknown
                reply(ReadLacResponse(rid, StatusCode.UNKNOWN, lid, None, -1))
            else:
                last = self.engine.last_entry_id(lid)
                reply(ReadLacResponse(rid, OK, lid, state.lac_proof, last, state.lafr))

        self.counters["read_lacs"] += 1
        if req.flags & READ_FLAG_FENCE:
            self._fence(lid, req.master_key, answer)
        else:
            answer(OK)

    # --- explicit LAC ---------------------------------------------------------------------

    def _write_lac(self, req: WriteLacRequest, reply: Reply, peer: Peer) -> None:
        rid, lid = req.request_id, req.ledger_id
        state = self.ledger(lid)
        if state is None:
            reply(WriteLacResponse(rid, StatusCode.NO_SUCH_LEDGER, lid))
            return
        if not self._key_ok(state, req.master_key):
            reply(WriteLacResponse(rid, StatusCode.UNAUTHORIZED, lid))
            return
        if req.digest != lac_digest(lid, req.lac):
            reply(WriteLacResponse(rid, StatusCode.BAD_DIGEST, lid))
            return
        proof = LacProof(LAC_RECORD_ENTRY_ID, req.lac, 0, req.digest)
        if state.explicit_lac is None or proof.lac > state.explicit_lac.lac:
            self._put_info(lid, state.info(explicit_lac=proof))
            state.explicit_lac = proof
        if state.offer_lac(proof):
            state.wake_waiters()

        def durable(exc: BaseException | None) -> None:
            reply(WriteLacResponse(rid, OK if exc is None else StatusCode.IO_ERROR, lid))

        self.counters["write_lacs"] += 1
        self.journal.append(REC_EXPLICIT_LAC, ledger_body(lid, pack_proof(proof)), durable)

    def _write_lafr(self, req: WriteLafrRequest, reply: Reply, peer: Peer) -> None:
        """Guaranteed write quorum: keep the writer's LAFR (a hint; docs/protocol.md)."""
        rid, lid = req.request_id, req.ledger_id
        state = self.ledger(lid)
        if state is None:
            reply(WriteLafrResponse(rid, StatusCode.NO_SUCH_LEDGER, lid))
        elif not self._key_ok(state, req.master_key):
            reply(WriteLafrResponse(rid, StatusCode.UNAUTHORIZED, lid))
        else:
            state.lafr = max(state.lafr, req.lafr)
            self.counters["write_lafrs"] += 1
            reply(WriteLafrResponse(rid, OK, lid))

    # --- audits and info ------------------------------------------------------------------

    def _list_entries(self, req: ListEntriesRequest, reply: Reply, peer: Peer) -> None:
        """List what the ledger holds, durably: copies not yet synced are synced first
        (bookie/deferred.py)."""
        if not self.deferred.pending(req.ledger_id) or req.max_count <= 0:
            self._list_now(req, reply)
        elif self.sync_engine is None:  # no bookie around the handler (unit tests)
            begun = self.deferred.sync_begins()
            self.engine.sync()
            self.deferred.synced(begun)
            self._list_now(req, reply)
        else:
            task = asyncio.get_running_loop().create_task(self._list_durable(req, reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _list_durable(self, req: ListEntriesRequest, reply: Reply) -> None:
        assert self.sync_engine is not None
        timeout_s = self.config.list_sync_timeout_s
        try:
            pending = partial(self.deferred.pending, req.ledger_id)
            async with asyncio.timeout(timeout_s):
                for _ in range(LIST_SYNCS_MAX):
                    if not pending():
                        break
                    # The checkpoint skips itself if one before it covered the ledger.
                    # Shielded: a listing that gives up leaves it to finish, not cut short.
                    sync = asyncio.ensure_future(self.sync_engine(pending))
                    sync.add_done_callback(_consume)
                    await asyncio.shield(sync)
        except TimeoutError:
            message = f"engine sync for ledger {req.ledger_id}'s copies took over {timeout_s} s"
            self._failed(req, reply, TimeoutError(message))
            return
        except Exception as exc:  # the copies may not be durable: no listing
            self._failed(req, reply, exc)
            return
        self.counters["lists_after_sync"] += 1
        self._list_now(req, reply)

    def _list_now(self, req: ListEntriesRequest, reply: Reply) -> None:
        rid, lid = req.request_id, req.ledger_id
        if req.max_count <= 0 or req.start_entry_id < 0:
            reply(ListEntriesResponse(rid, StatusCode.BAD_REQUEST, lid, [], -1))
            return
        state = self.ledger(lid)
        if state is None:
            reply(ListEntriesResponse(rid, StatusCode.NO_SUCH_LEDGER, lid, [], -1))
            return
        count = min(req.max_count, self.config.list_entries_max)
        ids = self.engine.list_entries(lid, req.start_entry_id, count)
        next_id = ids[-1] + 1 if len(ids) == count and ids[-1] < INT64_MAX else -1
        reply(ListEntriesResponse(rid, OK, lid, to_ranges(ids), next_id))

    def _bookie_info(self, req: BookieInfoRequest, reply: Reply, peer: Peer) -> None:
        free, total = self.disk_space
        reply(BookieInfoResponse(req.request_id, OK, free, total, self.read_only,
                                 self.config.bookie_id))  # fmt: skip

    # --- operator requests: scrub, ledger records ------------------------------------------

    def _scrub(self, req: ScrubRequest, reply: Reply, peer: Peer) -> None:
        if self.scrub_control is None:
            reply(ErrorResponse(req.request_id, StatusCode.BAD_REQUEST, "no scrubber here"))
            return
        reply(ScrubResponse(req.request_id, OK, *self.scrub_control(req.start)))

    def _ledger_records(self, req: LedgerRecordsRequest, reply: Reply, peer: Peer) -> None:
        """A page of ledgers from ``start_ledger_id``: at most ``ledger_records_max`` of them
        and about half a frame of bytes (records carry custom metadata)."""
        if req.max_count <= 0:
            reply(LedgerRecordsResponse(req.request_id, StatusCode.BAD_REQUEST, [], -1))
            return
        ledgers = self.engine.ledgers()
        start = bisect.bisect_left(ledgers, req.start_ledger_id)
        count = min(req.max_count, self.config.ledger_records_max)
        budget = self.config.frame_bytes_max // 2
        records: list[bytes] = []
        for ledger_id in ledgers[start : start + count]:
            info = self.engine.get_ledger(ledger_id) or LedgerInfo()
            last = self.engine.last_entry_id(ledger_id)
            item = pack_held(Held(ledger_id, info.master_key, last, info.record))
            if records and len(item) > budget:
                break
            budget -= len(item)
            records.append(item)
        end = start + len(records)
        next_id = ledgers[end] if end < len(ledgers) else -1
        reply(LedgerRecordsResponse(req.request_id, OK, records, next_id))


def to_ranges(ids: list[int]) -> list[list[int]]:
    """Ascending ids as inclusive ``[first, last]`` runs: [1,2,3,7] -> [[1,3],[7,7]]."""
    ranges: list[list[int]] = []
    for i in ids:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ranges


def _consume(task: asyncio.Future[None]) -> None:
    """Retrieve a task's failure (its awaiter may have given up on it)."""
    if not task.cancelled():
        task.exception()


def _ignore(exc: BaseException | None) -> None:
    """Callback for records whose durability a later record's callback already implies."""


def _first_failure(statuses: list[StatusCode]) -> StatusCode:
    if statuses.count(OK) == len(statuses):  # the common case, without a generator
        return OK
    return next(s for s in statuses if s is not OK)


def _failed_answer(answer: Message) -> Message:
    """An add's answer when its journal record failed: its stored entries (those OK) are
    IO_ERROR, the refused ones keep their status."""
    if type(answer) is AddBatchResponse:
        statuses = [StatusCode.IO_ERROR if s is OK else StatusCode(s) for s in answer.statuses]
        return answer._replace(status=_first_failure(statuses), statuses=statuses)
    assert type(answer) is AddResponse
    return answer._replace(status=StatusCode.IO_ERROR)


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
