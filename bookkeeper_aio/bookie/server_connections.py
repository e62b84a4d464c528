"""The bookie's connections: tracking them (at most ``connections_max``) and backpressure, which
stops them reading (bookie/server.py says how a bookie runs as a whole).

When the journal's queue is full every connection stops reading until it drains: backpressure,
not memory growth. So does every connection while the engine's writes are ahead of its flushes
(``Engine.write_pressure``, looked at every ``engine_pressure_check_bytes`` written): rather
than RocksDB's own slowdown, which sleeps in this thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

from ..config import BookieConfig
from ..engine import Engine
from .connection import BookieConnection


class ConnectionControl:
    """The connections and their backpressure: a part of :class:`~.server.Bookie`, which holds
    the state."""

    config: BookieConfig
    counters: Counter[str]
    connections: dict[BookieConnection, None]
    stopped: asyncio.Event
    _engine: Engine | None
    _journal_full: bool
    _engine_wait: asyncio.Task[None] | None

    if TYPE_CHECKING:  # server_upkeep.BookieUpkeep's

        def _loop_ended(self, task: asyncio.Task[None]) -> None: ...

    # --- connections ----------------------------------------------------------------------

    def register(self, conn: BookieConnection) -> bool:
        """Track a new connection; False if ``connections_max`` is reached."""
        if len(self.connections) >= self.config.connections_max:
            self.counters["connections_refused"] += 1
            return False
        self.connections[conn] = None
        self.counters["connections_accepted"] += 1
        if self._journal_full:
            conn.pause_reading("journal")
        if self._engine_wait is not None:
            conn.pause_reading("engine")
        return True

    def unregister(self, conn: BookieConnection) -> None:
        """Forget a closed connection."""
        self.connections.pop(conn, None)

    def _journal_pressure(self, full: bool) -> None:
        self._journal_full = full
        self.counters["journal_pressure_events"] += full
        for conn in list(self.connections):
            conn.pause_reading("journal") if full else conn.resume_reading("journal")

    def _engine_pressure(self) -> None:
        """The engine's writes ran ahead of its background work (Engine.write_pressure): stop
        reading requests until it catches up. Without this, RocksDB itself slows the writes
        down by sleeping in this thread, and nothing else runs meanwhile: not the answers, not
        the reads, not the lease's keepalive."""
        if self._engine_wait is not None or self.stopped.is_set():
            return
        self.counters["engine_pressure_events"] += 1
        for conn in list(self.connections):
            conn.pause_reading("engine")
        self._engine_wait = asyncio.create_task(self._wait_for_engine(), name="engine-pressure")
        self._engine_wait.add_done_callback(self._loop_ended)

    async def _wait_for_engine(self) -> None:
        assert self._engine is not None
        started = time.monotonic()
        try:
            # A poll: RocksDB tells of a finished flush through no event of its own.
            while self._engine.write_pressure():  # noqa: ASYNC110
                await asyncio.sleep(self.config.engine_pressure_poll_s)
        finally:
            self.counters["engine_pressure_ms"] += round((time.monotonic() - started) * 1000)
            self._engine_wait = None
            for conn in list(self.connections):
                conn.resume_reading("engine")
