"""A simulated cluster for protocol tests: the real client, bookie and metadata code on 4
simulated bookies in virtual time (``bookkeeper_aio.sim``), one seed per cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from bookkeeper_aio.sim.loop import VirtualTimeLoop
from bookkeeper_aio.sim.runner import _teardown, quiet_logging
from bookkeeper_aio.sim.world import Faults, World

Scenario = Callable[[World], Awaitable[Any]]


@contextlib.contextmanager
def simulated_cluster(seed: int, bookies: int = 4) -> Iterator[Callable[[Scenario], Any]]:
    """``run(scenario)`` runs ``scenario(world)`` once the bookies are up (bounded: 300
    simulated seconds); everything is torn down at the end, the package's log level restored."""
    logger = logging.getLogger("bookkeeper_aio")
    level = logger.level
    quiet_logging()
    loop = VirtualTimeLoop()
    world = World(seed=seed, faults=Faults())

    def run(scenario: Scenario) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(300):
                for _ in range(bookies):
                    await world.add_bookie().start()
                return await scenario(world)

        return loop.run_until_complete(bounded())

    try:
        yield run
    finally:
        _teardown(loop, world)
        logger.setLevel(level)
