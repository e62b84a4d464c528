"""The fault loop: kill -9, SIGSTOP/SIGCONT and clean restarts of bookies, and healing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from .. import BookKeeper
from .base import (
    BOOKIE_START_TIMEOUT_S,
    DOWN_S,
    FAULT_EVERY_S,
    FAULT_WEIGHTS,
    FAULTS,
    FROZEN_S,
    TARGETED_FRACTION,
    LedgerLog,
    _ChaosState,
    _event_wait,
)


class _Faults(_ChaosState):
    """Methods of :class:`~bookkeeper_aio.chaos.run._Chaos` (its state is theirs)."""

    async def watch(self) -> None:
        """Every second: restart a bookie that died on its own (and report it); every five
        seconds: a progress line."""
        for tick in itertools.count(1):
            await asyncio.sleep(1)
            for index, bookie in enumerate(self.bookies):
                if bookie.running or index in self.unavailable or index in self.starting:
                    continue
                status = bookie.proc.returncode if bookie.proc is not None else None
                self.error(f"{self.name(index)} exited on its own (status {status})")
                self.unavailable.add(index)
                task = asyncio.create_task(self.start(index))
                self.fault_tasks.add(task)
                task.add_done_callback(self.fault_tasks.discard)
            if tick % 5:
                continue
            r = self.report
            acked = sum(log.acked_max + 1 for log in self.ledgers.values())
            down = ", ".join(
                f"bookie-{i}{' frozen' if i in self.frozen else ' dead'}"
                for i in sorted(self.unavailable)
            )
            self.say(
                f"acknowledged {acked} in {len(self.ledgers)} ledgers; kills {r.kills}, "
                f"freezes {r.freezes}, restarts {r.restarts}; recoveries {r.recoveries} "
                f"(undecided {r.recovery_retries}), fenced {r.fenced}; "
                f"unavailable: {down or 'none'}"
            )

    # --- faults ---------------------------------------------------------------------------

    async def fault_loop(self, reader_bk: BookKeeper) -> None:
        """Draw a fault every few seconds. A *targeted* fault hits a bookie of a live ledger's
        current ensemble and recovers that ledger at once, as when a bookie and the writer's
        host fail together."""
        rng = random.Random(f"{self.seed}/faults")
        # Every kind strikes at least once, whatever the timing: until each has, the draw is
        # among those still owed (a draw skipped for want of a victim stays owed).
        owed = list(FAULTS)
        while not await _event_wait(self.stop_faults, rng.uniform(*FAULT_EVERY_S)):
            action = rng.choice(owed) if owed else rng.choices(FAULTS, weights=FAULT_WEIGHTS)[0]
            delay = rng.uniform(*(FROZEN_S if action == "freeze" else DOWN_S))
            targeted = rng.random() < TARGETED_FRACTION and action != "restart"
            candidates = [
                i
                for i, b in enumerate(self.bookies)
                if i not in self.unavailable and i not in self.starting and b.running
            ]
            target: LedgerLog | None = None
            live = sorted(self.live)
            if targeted and live:
                target = self.ledgers[rng.choice(live)]
                ensemble = set(self.live[target.ledger_id].statistics()["ensemble"])
                candidates = [i for i in candidates if self.bookies[i].address in ensemble]
            if len(self.unavailable) >= self.max_unavailable or not candidates:
                continue
            victim = rng.choice(candidates)
            if action in owed:
                owed.remove(action)
            self.unavailable.add(victim)
            faults = {"kill": self.kill, "freeze": self.freeze, "restart": self.clean_restart}
            recover = None
            if target is not None:
                self.report.targeted += 1
                why = f"after {action} of bookie-{victim}"
                recover = functools.partial(self.recover_live, reader_bk, target, why)
            fault = functools.partial(faults[action], victim, delay)
            task = asyncio.create_task(self.fault_then(fault, recover))
            self.fault_tasks.add(task)
            task.add_done_callback(self.fault_tasks.discard)

    async def fault_then(
        self,
        fault: Callable[[], Coroutine[Any, Any, None]],
        recover: Callable[[], Coroutine[Any, Any, None]] | None,
    ) -> None:
        """Run a fault; start the recovery (if any) as soon as the fault has struck."""
        async with asyncio.TaskGroup() as group:
            group.create_task(fault())
            if recover is not None:
                await asyncio.sleep(0.05)  # the fault strikes at its first step
                group.create_task(recover())

    async def kill(self, index: int, down_s: float) -> None:
        self.say(f"kill -9 {self.name(index)}; restart in {down_s:.1f}s")
        self.bookies[index].kill()  # SIGKILL, then reaping: immediate
        self.report.kills += 1
        await _event_wait(self.stop_faults, down_s)
        await self.start(index)

    async def clean_restart(self, index: int, down_s: float) -> None:
        self.say(f"SIGTERM {self.name(index)}; restart in {down_s:.1f}s")
        status = await asyncio.to_thread(self.bookies[index].stop, 20.0)
        if status != 0:
            self.error(f"{self.name(index)} exited {status} after SIGTERM (expected 0)")
        self.report.clean_restarts += 1
        await _event_wait(self.stop_faults, down_s)
        await self.start(index)

    async def freeze(self, index: int, frozen_s: float) -> None:
        bookie = self.bookies[index]
        self.say(f"SIGSTOP {self.name(index)} for {frozen_s:.1f}s")
        bookie.signal(signal.SIGSTOP)
        self.frozen.add(index)
        self.report.freezes += 1
        try:
            await _event_wait(self.stop_faults, frozen_s)
        finally:  # never leave a bookie frozen, whatever happens to this task
            with contextlib.suppress(ProcessLookupError):
                bookie.signal(signal.SIGCONT)
            self.frozen.discard(index)
            self.unavailable.discard(index)
        self.say(f"SIGCONT {self.name(index)}")

    async def start(self, index: int) -> bool:
        """Start a dead bookie again (in a thread: it polls until the port listens)."""
        bookie = self.bookies[index]
        if bookie.running or index in self.starting:
            return bookie.running
        self.starting.add(index)
        try:
            await asyncio.to_thread(bookie.start, BOOKIE_START_TIMEOUT_S)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.error(f"{self.name(index)} did not restart: {exc}")
            return False
        finally:
            self.starting.discard(index)
        self.report.restarts += 1
        self.unavailable.discard(index)
        self.say(f"restarted {self.name(index)}")
        return True

    async def heal(self) -> None:
        """Thaw every bookie and restart the dead ones."""
        for bookie in self.bookies:
            if bookie.running:
                with contextlib.suppress(ProcessLookupError):
                    bookie.signal(signal.SIGCONT)
        self.frozen.clear()
        for index, bookie in enumerate(self.bookies):
            if not bookie.running and index not in self.starting and index not in self.lost:
                await self.start(index)
        self.say("healed: every bookie running (but those lost for good)")

    # --- writers --------------------------------------------------------------------------
