"""Timestamps of every add through a bookie, for finding where an add's time goes
(``trace_dir``: benchmarks only; ``python -m benchmarks breakdown``, docs/performance.md).

Theory of operation
-------------------
With ``trace_dir`` set, the handler notes for each add request (an AddRequest, an
AddBatchRequest, each part of a MultiAddRequest) when it started handling it, when its record
was queued to the journal, which journal batch made it durable and when its answer was handed
to the connection; the journal notes for each batch when its thread took it, when the write
returned, when the fdatasync returned and when the event loop ran its callbacks, and whether
the batch also rolled the journal over to a new file; the bookie notes its garbage
collector's pauses and its checkpoints. All times are ``time.perf_counter()``, which on Linux
is CLOCK_MONOTONIC, one clock for every process of the machine, so the benchmark joins them
with its own. At shutdown the bookie writes them to ``trace_dir/<bookie id>.json``.

At most ``trace_records_max`` records of each kind are kept (the first ones): tracing costs
~1 µs per add and its memory is bounded.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# One add request: ledger, first entry id, entries, handled, queued to the journal,
# journal batch number, answered.
Request = tuple[int, int, int, float, float, int, float]
# One journal batch: number, taken by the thread, written, synced, callbacks run, records,
# bytes, rolled over to a new file first (0/1).
Batch = tuple[int, float, float, float, float, int, int, int]


class AddTrace:
    """The bookie's timestamps (see the module docstring). Event-loop thread only, except
    :meth:`batch`, which the journal thread calls (a list append is atomic)."""

    def __init__(self, directory: str | Path, bookie_id: str, records_max: int) -> None:
        self.path = Path(directory) / (bookie_id.replace(":", "_").replace("/", "_") + ".json")
        self.records_max = records_max
        self.requests: list[Request] = []
        self.batches: list[tuple[int, float, float, float, int, int, int]] = []
        self.loop_times: dict[int, float] = {}  # batch number -> callbacks run
        self.gc_pauses: list[tuple[float, float, int]] = []  # start, end, generation
        self.checkpoints: list[tuple[float, float]] = []
        self.current_batch = -1  # the batch whose callbacks run now (set by the journal)
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def request(self, lid: int, first: int, count: int, handled: float, queued: float) -> float:
        """Note an add request answered now (``handled`` and ``queued``: when its handling
        started and its record was queued); the time now."""
        now = time.perf_counter()
        if len(self.requests) < self.records_max:
            self.requests.append((lid, first, count, handled, queued, self.current_batch, now))
        return now

    def batch(self, number: int, taken: float, written: float, synced: float, records: int,
              size: int, rolled: bool) -> None:  # fmt: skip
        """The journal thread wrote and synced batch ``number``."""
        if len(self.batches) < self.records_max:
            self.batches.append((number, taken, written, synced, records, size, int(rolled)))

    def batch_callbacks(self, number: int) -> None:
        """The event loop runs batch ``number``'s callbacks now."""
        self.current_batch = number
        if len(self.loop_times) < self.records_max:
            self.loop_times[number] = time.perf_counter()

    def checkpoint(self, started: float) -> None:
        self.checkpoints.append((started, time.perf_counter()))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif len(self.gc_pauses) < self.records_max:
            self.gc_pauses.append((self._gc_start, time.perf_counter(), info["generation"]))

    def write(self) -> Path:
        """Write everything noted to ``self.path`` (and stop noting GC pauses)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        batches = [(*b[:4], self.loop_times.get(b[0], b[3]), *b[4:]) for b in self.batches]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "requests": self.requests, "batches": batches, "gc_pauses": self.gc_pauses,
            "checkpoints": self.checkpoints,
        }))  # fmt: skip
        return self.path


class TracedReply:
    """An add's ``reply``, noting in the trace when its handling started (creation), when
    its journal record was queued (:meth:`queued_now`) and when it answered (the call)."""

    __slots__ = ("count", "first", "handled", "lid", "queued", "reply", "trace")

    def __init__(self, trace: AddTrace, reply: Callable[[Any], None], lid: int, first: int,
                 count: int, handled: float = 0.0) -> None:  # fmt: skip
        self.trace, self.reply = trace, reply
        self.lid, self.first, self.count = lid, first, count
        self.handled = self.queued = handled or time.perf_counter()

    def queued_now(self) -> None:
        self.queued = time.perf_counter()

    def __call__(self, response: Any) -> None:
        self.reply(response)
        self.trace.request(self.lid, self.first, self.count, self.handled, self.queued)
