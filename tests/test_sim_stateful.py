"""A hypothesis state machine drives one ledger at a time through adds, bookie crashes and
restarts (hence ensemble changes), recoveries and closes, on the simulated cluster, against a
simple model: every acknowledged entry is readable, in order, with its payload, and a closed
ledger ends exactly at the writer's LAC (its own close) or at or after it (a recovery).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bookkeeper_aio.errors import BookKeeperError
from bookkeeper_aio.sim.checkers import History, check_all
from bookkeeper_aio.sim.loop import VirtualTimeLoop
from bookkeeper_aio.sim.runner import _teardown, quiet_logging
from bookkeeper_aio.sim.world import Faults, World, close_client

BOOKIES = 5
PASSWORD = b"stateful"


class OneLedger(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        quiet_logging()
        self.loop = VirtualTimeLoop()
        self.world = World(seed=1, faults=Faults())
        self.history = History(self.loop.time)
        self.world.state.on_metadata = self.history.metadata_written
        for _ in range(BOOKIES):
            self.run(self.world.add_bookie().start())
        self.bk = self.world.client("writer")
        self.count = 0
        self._new_ledger()

    def run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(120):
                return await coro

        return self.loop.run_until_complete(bounded())

    def _new_ledger(self) -> None:
        self.writer = self.run(self.bk.create_ledger(3, 3, 2, PASSWORD))
        self.lid = self.writer.ledger_id
        self.acked: list[bytes] = []  # the model: payloads acknowledged, in entry order
        self.open = True

    # --- rules ------------------------------------------------------------------------------

    @precondition(lambda self: self.open)
    @rule(n=st.integers(1, 12))
    def append(self, n: int) -> None:
        payloads = [f"{self.lid}:{len(self.acked) + i}".encode() for i in range(n)]
        for i, p in enumerate(payloads):
            self.history.sent(self.lid, len(self.acked) + i, p)

        async def go() -> list[Any]:
            futures: list[Any] = []
            for p in payloads:
                try:
                    futures.append(self.writer.append_nowait(p))
                except BookKeeperError as exc:  # the writer failed already
                    futures.append(asyncio.sleep(0, exc))
            return await asyncio.gather(*futures, return_exceptions=True)

        for payload, result in zip(payloads, self.run(go()), strict=True):
            if isinstance(result, BaseException):
                assert isinstance(result, BookKeeperError), repr(result)
                break
            assert result == len(self.acked), "entry ids follow the append order"
            self.acked.append(payload)
            self.history.acked(self.lid, result)

    @rule(index=st.integers(0, BOOKIES - 1), power_loss=st.booleans())
    def crash_bookie(self, index: int, power_loss: bool) -> None:
        # Indexes 0-2 are the ledger's current ensemble: crashing those forces ensemble changes.
        current = self.world.ledger(self.lid).value.ensembles[-1][1]
        order = [*current, *(b.address for b in self.world.bookies if b.address not in current)]
        node = self.world.bookie_at(order[index])
        assert node is not None
        if node.up and sum(b.up for b in self.world.bookies) > 3:
            node.crash(power_loss=power_loss)

    @rule(index=st.integers(0, BOOKIES - 1))
    def restart_bookie(self, index: int) -> None:
        node = self.world.bookies[index]
        if not node.up:
            self.run(node.start())

    @precondition(lambda self: self.open)
    @rule()
    def close(self) -> None:
        self.run(self._restart_all())
        self.run(self.writer.close())
        self.history.writer_closed(self.lid, self.writer.last_add_confirmed)
        assert self.writer.last_add_confirmed == len(self.acked) - 1
        self._check_readable(exact=True)

    @rule()
    def recover(self) -> None:
        self.run(self._restart_all())
        self._check_readable(exact=False)

    @precondition(lambda self: not self.open)
    @rule()
    def next_ledger(self) -> None:
        self._new_ledger()

    @invariant()
    def tla_invariants_hold(self) -> None:
        check_all(self.world, self.history, quorum_check=True)
        assert not self.history.violations, [str(v) for v in self.history.violations]

    # --- helpers ----------------------------------------------------------------------------

    async def _restart_all(self) -> None:
        for node in self.world.bookies:
            if not node.up:
                await node.start()

    def _check_readable(self, *, exact: bool) -> None:
        """Open with recovery on another client; the model's entries must all be there."""

        async def go() -> tuple[int, list[bytes]]:
            bk = self.world.client(f"reader-{self.count}")
            self.count += 1
            try:
                reader = await bk.open_ledger(self.lid, PASSWORD, recovery=True)
                last = reader.metadata.last_entry_id
                entries = await reader.read(0, last) if last >= 0 else []
                return last, [e.payload for e in entries]
            finally:
                await close_client(bk)

        last, payloads = self.run(go())
        self.open = False
        segments = len(self.world.ledger(self.lid).value.ensembles)
        event(f"ledger ended with {min(segments, 3)}{'+' * (segments > 2)} segment(s)")
        if exact:
            assert last == len(self.acked) - 1
        assert last >= len(self.acked) - 1, "recovery truncated an acknowledged entry"
        assert payloads[: len(self.acked)] == self.acked
        for i, p in enumerate(payloads):
            assert p == f"{self.lid}:{i}".encode(), "a recovered entry the writer never sent"

    def teardown(self) -> None:
        try:
            if self.open:  # every program ends with the ledger recovered and read back
                self.recover()
            self.run(close_client(self.bk))
        finally:
            _teardown(self.loop, self.world)


OneLedger.TestCase.settings = settings(
    max_examples=80,  # ~25 s: make test stays under 15 min in CI
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOneLedger = OneLedger.TestCase


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The machine quiets the package's logging (quiet_logging); later tests check what is
    logged (caplog)."""
    logger = logging.getLogger("bookkeeper_aio")
    level = logger.level
    yield
    logger.setLevel(level)
