"""One chaos run (:func:`run_chaos`) and the command line (:func:`main`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import (
    BookKeeper,
    LedgerWriter,
)
from ..sandbox import Cluster
from .autorecovery import _Autorecovery, autorecovery_process
from .base import (
    BOOKIE_START_TIMEOUT_S,
    CONFIG,
    DRAIN_TIMEOUT_S,
    ChaosReport,
    LedgerLog,
    thawed_on_exit,
)
from .faults import _Faults
from .verify import _Verify
from .workload import _Workload


class _Chaos(_Faults, _Workload, _Verify, _Autorecovery):
    """One run; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        duration_s: float,
        seed: int,
        writers: int,
        rate: float,
        say: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.bookies = cluster.bookies
        self.duration_s = duration_s
        self.seed = seed
        self.writers = writers
        self.rate = rate  # entries per second per writer
        self._say = say
        self.report = ChaosReport(seed, duration_s)
        self.ledgers: dict[int, LedgerLog] = {}
        self.live: dict[int, LedgerWriter] = {}  # ledgers whose writer is appending
        self.unavailable: set[int] = set()  # bookie indexes dead or frozen
        self.frozen: set[int] = set()
        self.lost: set[int] = set()  # killed for good: never started again
        self.starting: set[int] = set()
        self.max_unavailable = max(0, min(2, len(self.bookies) - 3))
        self.stop_faults = asyncio.Event()
        self.stop_writers = asyncio.Event()
        self.fault_tasks: set[asyncio.Task[Any]] = set()
        self.closed_final: set[int] = set()
        self.last_failure = ""  # of the ledger being verified, for the report
        self.t0 = time.monotonic()


async def run_chaos(
    cluster: Cluster,
    duration_s: float,
    seed: int,
    *,
    writers: int = 3,
    rate: float = 250.0,
    bugs: frozenset[str] = frozenset(),
    say: Callable[[str], None] = print,
    lose: int = 1,
) -> ChaosReport:
    """Run writers, a recovering reader and faults for ``duration_s``; heal; verify.

    ``cluster`` must be started (at least 4 bookies; 5 allow two faults at once). ``rate`` is
    entries per second per writer; ``bugs`` re-introduces known client bugs (the simulator's
    switches, e.g. ``unknown-as-negative``) in the reader's client, to see the check catch
    them. ``lose`` bookies are killed for good while an autorecovery process runs: at the
    end every ledger must be back at WQ (chaos/autorecovery.py). Every bookie but those lost
    runs and none is frozen when this returns.
    """
    chaos = _Chaos(cluster, duration_s, seed, writers, rate, say)
    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()

    def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        trace = "".join(traceback.format_exception(exc)) if exc is not None else ""
        chaos.error(f"event loop: {context.get('message')} {trace}".strip())
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_error)
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            if lose:
                log = Path(cluster.root) / "autorecovery.log"
                stack.enter_context(autorecovery_process(cluster.uri, log))
            clients = []
            for i in range(writers + 1):  # 0: the reader; then one per writer
                rng = random.Random(f"{seed}/client/{i}")
                client_bugs = bugs if i == 0 else frozenset()
                connecting = BookKeeper.connect(cluster.uri, CONFIG, rng=rng, bugs=client_bugs)
                clients.append(await stack.enter_async_context(connecting))
            say(
                f"chaos seed {seed}: {writers} writers, a recovering reader, faults for "
                f"{duration_s:.0f}s on {len(cluster.bookies)} bookies "
                f"(at most {chaos.max_unavailable} unavailable)"
            )
            work = [asyncio.create_task(chaos.writer(i, c)) for i, c in enumerate(clients[1:])]
            work.append(asyncio.create_task(chaos.reader(clients[0])))
            faults = asyncio.create_task(chaos.fault_loop(clients[0]))
            tasks = [*work, faults, asyncio.create_task(chaos.watch())]
            tasks.append(asyncio.create_task(chaos.lose_bookies(lose)))
            await asyncio.sleep(duration_s)

            chaos.stop_faults.set()
            await asyncio.wait([faults, *chaos.fault_tasks], timeout=BOOKIE_START_TIMEOUT_S + 10)
            await chaos.heal()
            chaos.stop_writers.set()
            done, pending = await asyncio.wait(work, timeout=DRAIN_TIMEOUT_S)
            for task in pending:
                chaos.error(f"{task.get_coro()!r} did not finish in {DRAIN_TIMEOUT_S}s")
            for task in done:
                if task.cancelled():
                    chaos.error(f"{task.get_coro()!r} ended cancelled")
                elif (exc := task.exception()) is not None:
                    chaos.error("".join(traceback.format_exception(exc)))
            chaos.say("writers stopped; verifying every ledger with a fresh client")
            async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
                await chaos.verify(bk)
                if lose:
                    await chaos.back_at_wq(bk)
    finally:
        for task in [*tasks, *chaos.fault_tasks]:
            task.cancel()
        await asyncio.gather(*tasks, *chaos.fault_tasks, return_exceptions=True)
        for bookie in cluster.bookies:  # nothing stays frozen, even after an exception
            if bookie.running:
                with contextlib.suppress(ProcessLookupError):
                    bookie.signal(signal.SIGCONT)
        loop.set_exception_handler(previous_handler)
    chaos.report.elapsed_s = time.monotonic() - chaos.t0
    return chaos.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bookkeeper_aio.chaos",
        description="Chaos test against etcd and real bookie processes on 127.0.0.1; "
        "exit status 1 if an acknowledged entry was lost or a ledger did not close.",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=250.0, help="entries/s per writer")
    parser.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files"))
    parser.add_argument("--lose", type=int, default=1,
                        help="bookies killed for good (autorecovery runs; 0: none)")  # fmt: skip
    parser.add_argument("--dir", help="keep the cluster's data and logs here")
    parser.add_argument(
        "--bug", action="append", default=[], help="a known client bug for the reader to have"
    )
    args = parser.parse_args(argv)
    if args.bookies < 4:
        parser.error("--bookies must be at least 4 (E3 ensembles and one fault)")
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bookkeeper-aio-chaos-"))
    print(f"starting etcd and {args.bookies} bookies under {root}", flush=True)
    replay = f"python -m bookkeeper_aio.chaos --duration {args.duration:g} --seed {seed}"
    _interrupt_on_signals()
    report: ChaosReport | None = None
    try:
        with Cluster(root, args.bookies, args.engine) as cluster, thawed_on_exit(cluster):
            report = asyncio.run(
                run_chaos(
                    cluster, args.duration, seed, writers=args.writers, rate=args.rate,
                    bugs=frozenset(args.bug), say=lambda text: print(text, flush=True),
                    lose=args.lose,
                )
            )  # fmt: skip
    except KeyboardInterrupt:
        print(f"interrupted; every process stopped; data and logs kept under {root}", flush=True)
        return 130
    if report.ok and not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"data and bookie logs kept under {root}", flush=True)
    print(report.summary(), flush=True)
    print(f"to replay: {replay}", flush=True)
    return 0 if report.ok else 1


def _interrupt_on_signals() -> None:
    """SIGTERM (and SIGINT, unless ignored) raise KeyboardInterrupt once: the tasks are
    cancelled, frozen bookies thawed and every process stopped; later signals are ignored so
    that the teardown finishes."""

    def interrupt(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, interrupt)
