"""A virtual-time event loop: idle time costs nothing, so a simulated minute takes milliseconds.

Theory of operation
-------------------
:class:`VirtualTimeLoop` is a ``SelectorEventLoop`` whose clock is a number it owns and whose
selector never waits: when asyncio would block for ``timeout`` seconds (nothing ready until the
next timer), the selector adds ``timeout`` to the clock and returns at once, so the loop jumps
to the next timer. With no I/O, no threads and callbacks run in FIFO order, a run is a pure
function of its inputs and its rng: code under simulation that hands work to a thread
(``run_in_executor``, ``asyncio.to_thread``) gets :class:`RealThreadError`, since the clock would
jump from timer to timer while the thread ran. Blocking with no timer at all means every task
waits for something that can never happen: :class:`Deadlock` is raised instead of hanging; a
loop that keeps running callbacks without the clock ever moving (a busy retry loop) raises
:class:`Livelock`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike


_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is scheduled: the simulation can make no progress."""


class Livelock(RuntimeError):
    """The loop keeps running callbacks but the clock never moves: something spins."""


class RealThreadError(RuntimeError):
    """Code under simulation handed work to a real thread (``VirtualTimeLoop.run_in_executor``)."""


SPIN_ITERATIONS_MAX = 200_000  # loop iterations in a row without the clock moving


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[FileDescriptorLike, selectors.SelectorKey] = {}  # by fd
        self._spins = 0

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every task waits and no timer is scheduled")
        if timeout > 0:
            self._spins = 0
            self._loop.advance(timeout)
        else:
            self._spins += 1
            if self._spins > SPIN_ITERATIONS_MAX:
                raise Livelock(f"{self._spins} loop iterations without virtual time passing")
        return []

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring). ``time()`` starts at 0."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector does this when the loop would block)."""
        if seconds > 0:
            self._now += seconds

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        """Refused: a real thread's wall time would reach the schedule. While it ran, the
        selector would jump the clock from timer to timer, so a seed would not replay exactly
        (``asyncio.to_thread`` comes here too)."""
        raise RealThreadError(f"a real thread in the simulation: {func!r}")
