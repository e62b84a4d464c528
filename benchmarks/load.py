"""Load generators: a closed loop (N operations outstanding, like BookKeeper's
BenchThroughputLatency) and an open loop (a fixed rate, like the OpenMessaging Benchmark).

Theory of operation
-------------------
Both drive a ``send`` function that starts one operation and returns a future (an add, a read,
an etcd put) or, with ``callbacks=True``, takes a ``done(result, error)`` to call once (the
writer's ``append_callback``: no future, handle and done-callback per add, which cost the client
~0.4 µs per entry). The closed loop starts ``outstanding`` operations and starts the next one
from each completion's callback, until the duration (or the count) is used up; latency is
measured from the send (from the completion that triggers it: at most the driver's few µs
early). The open loop sends operation *i* at ``start + i / rate`` and measures latency from that
*intended* time, so a stall also counts against the operations that should have been sent during
it (no coordinated omission); ``outstanding`` then only bounds memory.

Time is ``time.perf_counter``: uvloop's ``loop.time()`` has millisecond resolution. The open
loop wakes at most once a millisecond (uvloop's timer resolution: a shorter sleep is a zero
timer, and the loop would spin) and sends everything due by then, so above 1000/s operations
due in the same millisecond leave together and latencies include up to ~1 ms of that slack.

A ``send`` that raises (the ledger handle failed) counts one error and stops that slot; a
future that fails counts one error. Both loops end when every started operation finished;
``drain_timeout_s`` bounds that wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .stats import latency_summary, timeline

Send = Callable[[], "asyncio.Future[Any]"]
Done = Callable[[Any, BaseException | None], None]
CallbackSend = Callable[[Done], object]
Weight = Callable[[Any], int]

OPEN_LOOP_TICK_S = 0.001  # uvloop's timer resolution
PAYLOAD_POOL_BYTES_MAX = 8 << 20
PAYLOAD_POOL_COUNT_MAX = 4096


def payload_pool(entry_size: int) -> list[bytes]:
    """Distinct random payloads of ``entry_size`` bytes (at most 4096 of them, 8 MiB), for a
    load to use in turn.

    Real entries differ from one another: with one payload repeated, RocksDB's block
    compression (when enabled) squeezed each block's identical entries into one and the
    benchmark wrote a fraction of the bytes a real load would.
    """
    count = max(1, min(PAYLOAD_POOL_COUNT_MAX, PAYLOAD_POOL_BYTES_MAX // max(1, entry_size)))
    return [os.urandom(entry_size) for _ in range(count)]


def _one(_: Any) -> int:
    return 1


@dataclass
class LoadResult:
    """What one run of a load generator measured."""

    latencies_s: list[float] = field(default_factory=list)
    completions_s: list[float] = field(default_factory=list)  # perf_counter at each latency
    started_s: float = 0.0  # perf_counter when the load started
    entries: int = 0  # operations, or entries when an operation carries several (reads)
    errors: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0

    def fail(self, exc: BaseException) -> None:
        """Count one failed operation (the first one's text is kept)."""
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    def summary(self, entry_bytes: int) -> dict[str, Any]:
        """entries/s, MB/s, errors and the latency percentiles."""
        elapsed = max(self.elapsed_s, 1e-9)
        return {
            "operations": len(self.latencies_s),
            "entries": self.entries,
            "entries_per_s": self.entries / elapsed,
            "mb_per_s": self.entries * entry_bytes / elapsed / 1e6,
            "errors": self.errors,
            "first_error": self.first_error,
            "elapsed_s": self.elapsed_s,
            **latency_summary(self.latencies_s),
            "timeline": timeline(self.latencies_s, self.completions_s, self.started_s),
        }


@dataclass
class LoadTrace:
    """Per operation, for joining with the servers' timestamps (benchmarks/breakdown.py):
    ``sent[i]`` is (what ``send`` returned, intended send time, actual send time) and
    ``done`` holds (i, completion time) for those that succeeded. Callback loads only."""

    sent: list[tuple[Any, float, float]] = field(default_factory=list)
    done: list[tuple[int, float]] = field(default_factory=list)


@contextlib.contextmanager
def frozen_gc(freeze: bool = True) -> Iterator[None]:
    """With ``freeze``: collect, then ``gc.freeze()`` for the block, so the garbage
    collector's full collections skip every object made before it (the client's connections,
    the imported modules, the earlier phases' leftovers) and scan only what the load makes;
    unfrozen after. A full collection of the benchmark's client, connected and idle, took
    108-162 ms on a loaded machine and ~0 frozen (docs/performance.md): its pause lands on
    every operation in flight."""
    if not freeze:
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class GcPauses:
    """The garbage collector's pauses in this process while installed (``with``): each as
    (start, end, generation). A full (generation 2) collection walks every tracked object of
    the process, and its pause hits every operation in flight."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._start = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((self._start, time.perf_counter(), info["generation"]))

    def summary(self) -> dict[str, Any]:
        """Collections per generation, the longest pause and the full collections' total."""
        gens = [g for _, _, g in self.pauses]
        return {
            "client_gc_collections": [gens.count(g) for g in range(3)],
            "client_gc_pause_max_ms": max((e - s for s, e, _ in self.pauses), default=0) * 1000,
            "client_gc_gen2_ms": sum(e - s for s, e, g in self.pauses if g == 2) * 1000,
        }


class _Slot:
    """One operation in flight through a callback ``send``: its start time, what runs after
    it, and its ``done`` bound once. Slots are reused, so an operation allocates nothing the
    garbage collector tracks (a closure per operation was ~5 such objects, and the cyclic
    GC then took ~1 µs of the client's CPU per add: docs/performance.md at e27bdd3, eighth
    round)."""

    __slots__ = ("done", "index", "t0", "then", "tracker")

    def __init__(self, tracker: _Tracker) -> None:
        self.tracker = tracker
        self.index = -1  # in the tracker's LoadTrace, when it has one
        self.t0 = 0.0
        self.then: Callable[[float], None] | None = None
        self.done: Done = self._done

    def _done(self, value: Any, error: BaseException | None) -> None:
        self.tracker._done(value, error, self.t0, self.then, self)


class _Tracker:
    """Completion bookkeeping shared by both loops."""

    def __init__(self, weight: Weight, callbacks: bool, trace: LoadTrace | None = None) -> None:
        self.result = LoadResult()
        self.trace = trace
        self.weight = weight
        self.callbacks = callbacks
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.last_completion = time.perf_counter()
        self._free: list[_Slot] = []  # slots of finished operations, for the next ones

    def start(
        self, send: Send | CallbackSend, t0: float, then: Callable[[float], None] | None = None
    ) -> bool:
        """Send one operation whose latency counts from ``t0``; False if ``send`` raised.
        ``then(now)`` runs after its completion is counted."""
        # The per-operation path is kept short: the driver's CPU is the client's CPU. (So no
        # cast: ``send`` is a CallbackSend when self.callbacks, else a Send; hence the ignores.)
        try:
            if self.callbacks:
                slot = self._free.pop() if self._free else _Slot(self)
                slot.t0, slot.then = t0, then
                try:
                    if self.trace is None:
                        send(slot.done)  # type: ignore[call-arg]
                    else:
                        sent, now = self.trace.sent, time.perf_counter()
                        slot.index = len(sent)
                        sent.append((send(slot.done), t0, now))  # type: ignore[call-arg]
                except Exception:
                    self._free.append(slot)
                    raise
            else:
                send().add_done_callback(lambda f: self._done_future(f, t0, then))  # type: ignore[call-arg, attr-defined]
        except Exception as exc:
            self.result.fail(exc)
            return False
        if not self.in_flight:
            self.idle.clear()
        self.in_flight += 1
        return True

    def _done_future(
        self, future: asyncio.Future[Any], t0: float, then: Callable[[float], None] | None
    ) -> None:
        error = asyncio.CancelledError() if future.cancelled() else future.exception()
        self._done(None if error else future.result(), error, t0, then)

    def _done(
        self,
        value: Any,
        error: BaseException | None,
        t0: float,
        then: Callable[[float], None] | None,
        slot: _Slot | None = None,
    ) -> None:
        now = time.perf_counter()
        self.in_flight -= 1
        self.last_completion = now
        result = self.result
        if error is not None:
            result.fail(error)
        else:
            result.latencies_s.append(now - t0)
            result.completions_s.append(now)
            if slot is not None and self.trace is not None:
                self.trace.done.append((slot.index, now))
            result.entries += 1 if self.weight is _one else self.weight(value)
        if slot is not None:
            self._free.append(slot)  # before then(): the next operation takes it
        if then is not None:
            then(now)
        if not self.in_flight:
            self.idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait until every started operation finished (bounded)."""
        async with asyncio.timeout(timeout_s):
            await self.idle.wait()


async def closed_loop(
    send: Send | CallbackSend,
    outstanding: int,
    duration_s: float | None = None,
    count: int | None = None,
    *,
    weight: Weight = _one,
    drain_timeout_s: float = 60.0,
    callbacks: bool = False,
) -> LoadResult:
    """Keep ``outstanding`` operations in flight for ``duration_s`` or ``count`` sends.

    Raises:
        TimeoutError: started operations did not finish within ``drain_timeout_s``.
    """
    assert outstanding >= 1 and (duration_s is not None or count is not None)
    tracker = _Tracker(weight, callbacks)
    start = tracker.result.started_s = time.perf_counter()
    deadline = start + duration_s if duration_s is not None else float("inf")
    remaining = count if count is not None else -1

    def launch(now: float) -> None:
        nonlocal remaining
        if remaining == 0 or now >= deadline:
            return
        remaining -= 1
        tracker.start(send, now, launch)  # a completion's time is the next send's

    for _ in range(outstanding):
        launch(time.perf_counter())
    await tracker.drain((duration_s or 0) + drain_timeout_s)
    tracker.result.elapsed_s = tracker.last_completion - start
    return tracker.result


async def open_loop(
    send: Send | CallbackSend,
    rate_per_s: float,
    duration_s: float,
    outstanding_max: int,
    *,
    weight: Weight = _one,
    drain_timeout_s: float = 60.0,
    callbacks: bool = False,
    trace: LoadTrace | None = None,
) -> LoadResult:
    """Send at ``rate_per_s`` for ``duration_s``; latency from each intended send time.

    At most ``outstanding_max`` operations are in flight; past that the loop waits, and the
    wait shows up in the latencies of the operations it delays.

    Raises:
        TimeoutError: started operations did not finish within ``drain_timeout_s``.
    """
    assert rate_per_s > 0 and outstanding_max >= 1
    tracker = _Tracker(weight, callbacks, trace)
    room = asyncio.Event()
    room.set()

    def freed(_now: float) -> None:
        if tracker.in_flight < outstanding_max:
            room.set()

    total = max(1, int(rate_per_s * duration_s))
    start = tracker.result.started_s = time.perf_counter()
    sent = 0
    async with asyncio.timeout(duration_s + drain_timeout_s):
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * rate_per_s) + 1)
            while sent < due:
                if tracker.in_flight >= outstanding_max:
                    room.clear()
                    await room.wait()
                if not tracker.start(send, start + sent / rate_per_s, freed):
                    total = sent  # the handle failed: stop sending
                    break
                sent += 1
            # At least one tick: a shorter sleep is a zero timer under uvloop (ms resolution),
            # and the loop then spun, one send per iteration, burning the CPU the bookies
            # share (at 10k/s the client used 70 % of a core; at 20k/s the tick halved its CPU).
            wait_s = start + sent / rate_per_s - time.perf_counter()
            await asyncio.sleep(max(OPEN_LOOP_TICK_S, wait_s))
    await tracker.drain(drain_timeout_s)
    tracker.result.elapsed_s = tracker.last_completion - start
    return tracker.result


async def drive(
    send: Send | CallbackSend,
    outstanding: int,
    duration_s: float,
    rate_per_s: float | None = None,
    *,
    weight: Weight = _one,
    callbacks: bool = False,
) -> LoadResult:
    """The open loop if a rate is given, else the closed loop (``callbacks``: ``send`` takes
    a ``done``, as above)."""
    if rate_per_s:
        return await open_loop(
            send, rate_per_s, duration_s, outstanding, weight=weight, callbacks=callbacks
        )
    return await closed_loop(send, outstanding, duration_s, weight=weight, callbacks=callbacks)
