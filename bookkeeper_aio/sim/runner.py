"""Run one seed, or sweep many, and report invariant violations.

Theory of operation
-------------------
:func:`run_seed` builds a fresh :class:`~bookkeeper_aio.sim.loop.VirtualTimeLoop`, a
:class:`~bookkeeper_aio.sim.world.World` and a scenario from the seed, plays it and returns a
:class:`SimResult`. Everything random comes from the seed, so the same seed (and bug switches)
replays the same run exactly: same trace, same virtual end time. An exception that escapes a
callback or task, a deadlock, or a run that exceeds ``VIRTUAL_LIMIT_S`` is a violation too.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .autorecovery import maybe_enable
from .checkers import ClosedLedgerEntriesAtWriteQuorum, History, Violation
from .gwq import GWQ_BUGS
from .logs import LOG_BUGS
from .loop import Deadlock, Livelock, VirtualTimeLoop
from .races import maybe_race
from .workload import Run, Scenario, draw_scenario, maybe_journal_errors, maybe_share_client
from .world import Faults, World

VIRTUAL_LIMIT_S = 600.0
# Real seconds a sweep's worker may spend on one seed (seeds take 0.1-5 s here): past it a
# callback spins inside one loop iteration, which the virtual loop cannot see.
SEED_WALL_S_MAX = 600.0

KNOWN_BUGS = (
    "recovery-reads-without-fence",
    "recovery-below-last-segment",
    "unknown-as-negative",
    "no-limbo",
    "no-fence-on-boot",
    "crash-always-kept-writes",
    *LOG_BUGS,
    "replication-ignores-placement",
    *GWQ_BUGS,
)


@dataclass
class SimResult:
    seed: int
    bugs: frozenset[str]
    scenario: Scenario
    violations: list[Violation]
    trace: list[str]
    virtual_s: float
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        """The seed, the violations and the tail of the trace."""
        bugs = "".join(f" --bug {b}" for b in sorted(self.bugs))
        lines = [
            f"seed {self.seed}: {len(self.violations)} violation(s); replay with "
            f"python -m bookkeeper_aio.sim --seed {self.seed}{bugs}",
            f"scenario: {self.scenario}",
        ]
        lines += [f"  {v}" for v in self.violations]
        lines.append("trace (the events up to the first violation):")
        lines += [f"  {t}" for t in self.trace]
        return "\n".join(lines)


def run_seed(
    seed: int, bugs: Iterable[str] = (), client_changes: Mapping[str, Any] | None = None
) -> SimResult:
    """Play the scenario of ``seed`` with the given bug switches; see the module docstring.
    ``client_changes``: fields of every simulated client's config (tests only: e.g. a path
    that the default limits leave to long tails)."""
    bugs = frozenset(bugs)
    unknown = bugs - set(KNOWN_BUGS)
    if unknown:
        raise ValueError(f"unknown bug switch(es): {sorted(unknown)}; known: {KNOWN_BUGS}")
    started = time.perf_counter()
    loop = VirtualTimeLoop()
    faults = Faults()
    world = World(seed, faults, bugs)
    if client_changes:
        world.client_config = world.client_config.replace(**client_changes)
    history = History(loop.time)
    world.state.on_metadata = history.metadata_written
    scenario = draw_scenario(world.rng, faults)
    maybe_enable(seed, scenario)  # its own generator: other seeds play as before
    maybe_race(seed, scenario, faults)  # the same
    maybe_journal_errors(seed, scenario, faults)  # the same
    maybe_share_client(seed, scenario)  # the same
    world.calm_rates_changed()
    run = Run(world, scenario, history)
    if run.quorum_check:
        ClosedLedgerEntriesAtWriteQuorum(world, history).install()
    loop.set_exception_handler(lambda _loop, ctx: _unhandled(history, ctx))
    try:
        loop.run_until_complete(_bounded(run.play()))
    except (Deadlock, Livelock) as exc:
        history.violate("Liveness", f"{type(exc).__name__.lower()}: {exc}")
    except TimeoutError:
        history.violate("Liveness", f"the run did not end within {VIRTUAL_LIMIT_S} virtual s")
    except Exception as exc:  # a bug in the code under test (or the simulator): report it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        history.violate(
            "NoUnhandledErrors", f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
        )
    finally:
        virtual_s = loop.time()
        _teardown(loop, world)
    stats = {
        "net": dict(world.net.counters),
        "metadata_revision": world.state.revision,
        "power_losses": run.power_losses,
        "acked_copies_lost": run.acked_copies_lost,
        "fail_stops": world.fail_stops,
        "logs": run.log_stats,
        "autorecovery": run.ar.statistics() if run.ar is not None else None,
    }
    return SimResult(
        seed,
        bugs,
        scenario,
        list(history.violations),
        history.first_trace or list(history.trace),
        virtual_s,
        time.perf_counter() - started,
        stats,
    )


def scenario_of(seed: int) -> tuple[Scenario, Faults]:
    """The scenario and faults ``seed`` plays, drawn as :func:`run_seed` draws them, without
    playing (cheap: tests pick the seeds of one kind, e.g. race or journal-error seeds)."""
    faults = Faults()
    loop = VirtualTimeLoop()  # the world's parts may look for a loop as they are built
    try:
        world = World(seed, faults, frozenset())
        scenario = draw_scenario(world.rng, faults)
        maybe_enable(seed, scenario)
        maybe_race(seed, scenario, faults)
        maybe_journal_errors(seed, scenario, faults)
        maybe_share_client(seed, scenario)
    finally:
        loop.close()
    return scenario, faults


async def _bounded(coro: Any) -> None:
    async with asyncio.timeout(VIRTUAL_LIMIT_S):
        await coro


def _unhandled(history: History, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    if exc is None or isinstance(exc, asyncio.CancelledError):
        return
    history.violate("NoUnhandledErrors", f"{context.get('message')}: {type(exc).__name__}: {exc}")


def _teardown(loop: VirtualTimeLoop, world: World) -> None:
    try:
        for node in world.bookies:
            if node.up:
                node.crash(power_loss=False)
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except (Deadlock, Livelock):
        pass
    finally:
        loop.close()


def sweep(
    seeds: Iterable[int],
    bugs: Iterable[str] = (),
    *,
    stop_at_first: bool = False,
    workers: int | None = None,
    client_changes: Mapping[str, Any] | None = None,
    seed_wall_s: float = SEED_WALL_S_MAX,
) -> Iterator[SimResult]:
    """Run seeds, yielding each result in seed order; optionally stop at the first violation.
    ``client_changes``: as :func:`run_seed`'s, for every seed.

    Raises:
        SeedTimeoutError: a worker spent more than ``seed_wall_s`` real seconds on one seed
            (the workers are stopped; the seed replays with ``python -m bookkeeper_aio.sim``).

    Seeds are independent and each is deterministic, so ``workers`` processes (default:
    ``SIM_WORKERS``, else one per CPU) run them in parallel with the same results as one
    process; results still come out in order, at most ``2 * workers`` seeds ahead of the
    consumer (bounded memory, and little wasted work past a first violation)."""
    bugs = frozenset(bugs)
    count = workers if workers is not None else int(os.environ.get("SIM_WORKERS", "0"))
    count = count or os.cpu_count() or 1
    if count <= 1:
        for seed in seeds:
            result = run_seed(seed, bugs, client_changes)
            yield result
            if stop_at_first and not result.ok:
                return
        return
    context = multiprocessing.get_context("spawn")  # no inherited loops, locks or handlers
    # The workers replay exactly as ``python -m bookkeeper_aio.sim`` does: set iteration order
    # must not depend on the interpreter's hash seed (spawned children read the environment).
    hash_seed = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"
    with ProcessPoolExecutor(count, mp_context=context, initializer=quiet_logging) as pool:
        pending: deque[tuple[int, Future[SimResult]]] = deque()
        it = iter(seeds)
        try:
            while True:
                while len(pending) < 2 * count and (next_seed := next(it, None)) is not None:
                    future = pool.submit(run_seed, next_seed, bugs, client_changes)
                    pending.append((next_seed, future))
                if not pending:
                    return
                seed, future = pending.popleft()
                try:
                    # A seed not done seed_wall_s after the one before it has run that long
                    # at least (it started at the latest when that one's result came).
                    result = future.result(timeout=seed_wall_s)
                except TimeoutError:
                    _stop_workers(pool)  # else the pool's shutdown waits for the stuck one
                    raise SeedTimeoutError(
                        f"seed {seed} ran over {seed_wall_s:g} real seconds; replay it: "
                        f"python -m bookkeeper_aio.sim --seed {seed}"
                    ) from None
                yield result
                if stop_at_first and not result.ok:
                    return
        finally:
            # The seeds still pending (at most 2 * workers) run to their end as the pool shuts
            # down: cancelling them can hang Python 3.11's ProcessPoolExecutor.shutdown.
            if hash_seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = hash_seed


class SeedTimeoutError(RuntimeError):
    """A sweep's worker spent too long (real time) on one seed."""


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's worker processes (none is left running a seed), so that its shutdown
    returns; the executor keeps them in ``_processes`` (CPython 3.11-3.13)."""
    for process in list(getattr(pool, "_processes", {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def quiet_logging() -> None:
    """The simulated components log real errors on purpose (injected faults): keep only
    critical ones, so a sweep's output is the checkers' report."""
    logging.getLogger("bookkeeper_aio").setLevel(logging.CRITICAL + 1)
