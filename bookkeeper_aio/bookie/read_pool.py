"""Engine reads that may wait on the disk, in worker threads (BookKeeper's read thread pool).

Theory of operation
-------------------
A bookie answers every request on one event loop. A read the engine can answer from memory
(``Engine.can_read_now``: a cached batch, one still in a memtable, an absent entry) runs there,
as before: a thread hop would cost it more than the read. Any other read — a batch that has
to come from the disk — runs in one of ``read_threads`` worker threads, and its answer is made
back on the loop. Without this a bookie serving a catch-up reader or autorecovery's copies sat
with its loop blocked on each 1 MiB read in turn (py-spy: 41 % of one source bookie's wall
time in the engine's read of a batch), answering nothing else meanwhile and reading from its
disk one request at a time.

Per ledger at most ``LEDGER_THREADS_MAX`` reads are in threads; the ledger's other reads that
are not in memory wait for one of them to end, and mostly find the batch it brought in
(:meth:`ReadPool.read`).

Bounds: at most ``read_queue_max`` reads wait for or run in the threads; past it a read runs on
the loop, which then reads no requests while it waits: the reads' own backpressure, the
behaviour of ``read_threads = 0``. Each read is also a request in flight on its connection
(``connection_requests_in_flight_max``). A read that fails in its thread is answered like one
that failed on the loop. :meth:`ReadPool.close` waits for the reads running (each a bounded
disk read) and drops those not started: the bookie is stopping and their connections close.

The simulator's bookies have no read threads (``read_threads = 0``; their engines answer from
memory anyway).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from ..engine import Engine
from ..protocol import pack_read_entry

_T = TypeVar("_T")
Then = Callable[[_T | None, Exception | None], None]

# Reads of one ledger in threads at once (ReadPool.read).
LEDGER_THREADS_MAX = 4


class _Busy:
    """A ledger's reads in threads, and those waiting for one of them to end."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: deque[Callable[[], None]] = deque()


class ReadPool:
    """Runs a read in a worker thread and its continuation on the event loop."""

    def __init__(self, threads: int, queue_max: int) -> None:
        self._threads = threads
        self._queue_max = queue_max
        self._executor: ThreadPoolExecutor | None = None  # started by the first read
        self.queued = 0  # waiting for a thread or running in one
        # Ledgers with reads in threads: how many, and the reads of each waiting (read()).
        self._busy: dict[int, _Busy] = {}
        self.threaded = 0  # reads run in a thread, in all
        self.inline = 0  # reads that could have waited on the disk but ran on the loop

    def read(
        self, ledger_id: int, ready: Callable[[], bool], read: Callable[[], _T], then: Then[_T]
    ) -> None:
        """A read of ``ledger_id``: ``read()`` on the loop if ``ready()`` (the engine has what
        it needs in memory), else in a thread (:meth:`run`) — at most
        :data:`LEDGER_THREADS_MAX` of a ledger at a time. A read that is not ready while
        those are in threads waits for one of them: the reads of a batch arrive together, and
        the first ones bring the batch into memory for the others (each in a thread of its own
        halved a sequential reader's entries/s; one at a time per ledger slowed the copies of
        256 KiB entries, four to a batch). Once one ends, the waiting reads start over in
        order until one goes to a thread again: each is looked at once per start, not once
        per read of its ledger finished (10,000 in flight went quadratic)."""
        try:
            now = ready()
        except Exception as exc:
            then(None, exc)
            return
        if now:
            _call(read, then)
            return
        busy = self._busy.get(ledger_id)
        if busy is None:
            busy = self._busy[ledger_id] = _Busy()
        elif busy.running >= LEDGER_THREADS_MAX:
            busy.waiting.append(lambda: self.read(ledger_id, ready, read, then))
            return
        busy.running += 1

        def done(result: _T | None, exc: Exception | None) -> None:
            busy.running -= 1
            try:
                then(result, exc)
            finally:
                self._resume(ledger_id, busy)

        self.run(read, done)

    def _resume(self, ledger_id: int, busy: _Busy) -> None:
        """Start the reads that waited for ``ledger_id`` again, in order, while fewer than
        LEDGER_THREADS_MAX of it are in threads; forget the ledger once none is."""
        waiting = busy.waiting
        while waiting and busy.running < LEDGER_THREADS_MAX:
            waiting.popleft()()
        if not busy.running and not waiting and self._busy.get(ledger_id) is busy:
            del self._busy[ledger_id]

    def run(self, read: Callable[[], _T], then: Then[_T]) -> None:
        """Call ``read()`` in a worker thread, then ``then(result, None)`` — or ``then(None,
        exception)`` — on the event loop; on the loop at once if the pool is full (or has no
        threads)."""
        if self._threads <= 0 or self.queued >= self._queue_max:
            self.inline += 1
            _call(read, then)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="bookie-read")
        loop = asyncio.get_running_loop()
        self.queued += 1
        self.threaded += 1

        def done(future: Future[_T]) -> None:  # in the read's thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._finish, future, then)

        self._executor.submit(read).add_done_callback(done)

    def _finish(self, future: Future[_T], then: Then[_T]) -> None:
        self.queued -= 1
        if future.cancelled():
            return  # closed before it ran: its connection is closing too
        exc = future.exception()
        if exc is None:
            then(future.result(), None)
        elif isinstance(exc, Exception):
            then(None, exc)
        else:  # KeyboardInterrupt and the like: not a read's failure
            raise exc

    def close(self) -> None:
        """Wait for the reads running; drop the rest (blocking: run it in a worker thread)."""
        executor, self._executor = self._executor, None
        self._threads = 0  # a read after this runs on the loop (and meets a closed engine)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    async def aclose(self) -> None:
        """:meth:`close` from the event loop: in a worker thread if reads ever ran in one, else
        here at once. No thread is started to close a pool that never started one: in the
        simulator (whose engines answer from memory) a thread's wall time would move the
        virtual clock and a seed would not replay exactly."""
        if self._executor is None:
            self.close()
        else:
            await asyncio.to_thread(self.close)

    def statistics(self) -> dict[str, int]:
        return {"reads_queued": self.queued, "reads_threaded": self.threaded,
                "reads_inline": self.inline}  # fmt: skip


def _call(read: Callable[[], _T], then: Then[_T]) -> None:
    """``then(read(), None)``, or ``then(None, exception)``, here and now."""
    try:
        result = read()
    except Exception as exc:
        then(None, exc)
        return
    then(result, None)


class BatchRead:
    """A read batch's consecutive entries, gathered on the loop while the engine has them in
    memory and in a read thread from the first it may not (``gather``)."""

    __slots__ = ("budget", "done", "end_id", "engine", "error", "ledger_id", "missing",
                 "next_id", "parts", "size")  # fmt: skip

    def __init__(self, engine: Engine, ledger_id: int, first: int, end: int, budget: int) -> None:
        self.engine, self.ledger_id = engine, ledger_id
        self.next_id, self.end_id, self.budget = first, end, budget  # ids [first, end)
        self.parts: list[bytes | memoryview] = []  # pack_read_entry's, per entry
        self.size = 0  # records' bytes
        self.missing = False  # stopped at an absent entry
        self.error: Exception | None = None  # stopped at one the engine failed to read
        self.done = False  # stopped for good (the end, the budget, absent, an error)

    def gather(self, *, now_only: bool) -> bool:
        """Add entries until the end, the byte budget (at least one entry), an absent entry or
        an error; ``now_only``: stop before an entry the engine cannot read from memory and
        return False (on the loop), else True (done)."""
        engine, ledger_id = self.engine, self.ledger_id
        while not self.done and self.next_id < self.end_id:
            entry_id = self.next_id
            try:  # also runs from the fence's callback: answer whatever happens
                if now_only and not engine.can_read_now(ledger_id, entry_id):
                    return False
                record = engine.get_entry(ledger_id, entry_id)
            except Exception as exc:
                self.error = exc
                break
            if record is None:
                self.missing = True
                break
            if self.parts and self.size + len(record) > self.budget:
                break
            self.parts += pack_read_entry(entry_id, record)
            self.size += len(record)
            self.next_id += 1
        self.done = True
        return True
