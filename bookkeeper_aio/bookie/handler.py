"""The bookie's request processing: one method per operation, callbacks on the hot path.

Theory of operation
-------------------
:meth:`RequestHandler.handle` takes a decoded request and a ``reply`` callable and calls
``reply`` exactly once, now or later. Nothing here touches sockets; the connection
(``connection.py``) owns framing, limits and output. Time enters only through the event loop's
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

Where each part lives: the shared state, the ledger cache, the fence and failures in
``handler_state.py``; adds in ``handler_adds.py``; reads, long polls and the LAC in
``handler_reads.py``; listings, info and the operator's requests in ``handler_audits.py``.
:class:`RequestHandler` is all of them and the dispatch of a request to its path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import BookieConfig
from ..engine import Engine
from ..protocol import (
    AddBatchRequest,
    AddRequest,
    BookieInfoRequest,
    LedgerRecordsRequest,
    ListEntriesRequest,
    Message,
    MultiAddRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    ScrubRequest,
    WriteLacRequest,
    WriteLafrRequest,
)
from .handler_adds import AddPath
from .handler_audits import LIST_SYNCS_MAX, AuditPath, to_ranges
from .handler_reads import ReadPath
from .handler_state import UNKNOWN_KEY, HandlerState, JournalSink, Reply, error_response
from .long_poll import Peer

__all__ = [
    "LIST_SYNCS_MAX",
    "UNKNOWN_KEY",
    "HandlerState",
    "JournalSink",
    "Reply",
    "RequestHandler",
    "error_response",
    "to_ranges",
]


class RequestHandler(AddPath, ReadPath, AuditPath):
    """Executes requests against the engine and the journal (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        journal: JournalSink,
        config: BookieConfig,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(engine, journal, config, on_fatal=on_fatal)
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
