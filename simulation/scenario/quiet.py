"""When nothing in the process can run: how the in-process engine knows a moment is settled.

In one process on the in-memory log every service's work is a chain of callbacks on one event
loop: an append wakes the followers, a fold wakes its service, a decision or a report is an
append, a command's answer wakes its sender. When no callback is ready to run, every task
waits for something only time can bring: the virtual clock, which only the driver moves, or a
timer on the loop's own clock that watches rather than works (an executor's heartbeat, a
decider's safety tick). So the driver's settle and the deciders' pacing wait for that, not for
a stretch of real time: it comes as soon as the work is done, and after the same work on a
loaded machine as on an idle one.

asyncio has no public test for it: CPython's event loop keeps the callbacks ready to run in
its `_ready` queue, which is read here and nowhere else.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

#: The rank of a decider's pacing, which runs before a driver's settle (`DRIVER`).
SERVICE: Final = 0
DRIVER: Final = 1


class Quiet:
    """Hands out the loop's quiet moments one at a time, to the lowest rank first and, within
    a rank, to whoever asked first; whoever gets one runs before the next is handed out (its
    work may end the quiet)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._asked = asyncio.Event()

    async def until_quiet(self, rank: int = SERVICE) -> None:
        """Until nothing else in the process can run, and nobody of a lower rank (or the same
        rank, who asked earlier) is waiting for that too."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._order), future))
        self._asked.set()
        await future

    async def pace(self, seconds: float) -> None:
        """A decider's pacing in one process: not `seconds` of real time, but until the burst
        that woke it has landed, all of it."""
        await self.until_quiet(SERVICE)

    async def run(self) -> None:
        """Watch the loop (until cancelled): each time nothing but this can run, the next
        waiter goes on."""
        ready = ready_callbacks(asyncio.get_running_loop())
        while True:
            while self._waiting and self._waiting[0][2].done():  # its waiter was cancelled
                heapq.heappop(self._waiting)
            if not self._waiting:
                self._asked.clear()
                await self._asked.wait()
                continue
            await asyncio.sleep(0)  # a turn for everything that can run now
            if not ready and self._waiting:
                _, _, future = heapq.heappop(self._waiting)
                if not future.done():
                    future.set_result(None)


def ready_callbacks(loop: asyncio.AbstractEventLoop) -> collections.deque[Any]:
    ready = getattr(loop, "_ready", None)
    if not isinstance(ready, collections.deque):
        raise RuntimeError(f"{type(loop).__name__} does not show what is ready to run")
    return ready


class InlineExecutor(ThreadPoolExecutor):
    """The loop's default executor in one process: what a service hands to a thread (packing
    a checkpoint folder) is done at once on the loop instead, so no work goes on where the
    loop cannot see it, and it ends at the same point of the run every time."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to whoever awaits it, as a thread's would be
            done.set_exception(e)
        return done
