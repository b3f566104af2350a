"""Decision time for the services: the wall clock in production, a virtual one in tests.

The policy is pure (state and time in), so what time it is when a service decides is an input
the service is given, not one it reads: `WallClock` is the real time; `VirtualClock` stands
still until its owner moves it (a scenario's `advance`), and wakes the services sleeping on it
as their moments come. Pacing that only spreads work out (a retry's back-off, how often a loop
looks) stays on the event loop's own clock; what the rules count in time uses this one.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (the time every event carries)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Until `seconds` from now have passed on this clock."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


WALL_CLOCK = WallClock()


class VirtualClock:
    """A clock moved by hand. Sleepers wake, in order of their due times, when the clock is
    moved to or past them; `next_due` says when the next one would, so a driver can move the
    clock from one moment to the next and let the services act at each."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # equal due times wake in the order they slept

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)  # a turn of the loop, as asyncio.sleep(0) gives
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future  # a cancelled sleeper stays in the heap, done: skipped when it surfaces

    def next_due(self) -> float | None:
        """When the earliest sleeper wakes (None if nobody sleeps)."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    def move_to(self, when: float) -> None:
        """Set the clock to `when` (never back) and wake every sleeper due by then."""
        if when < self._now:
            raise ValueError(f"a clock does not go back: {when} is before {self._now}")
        self._now = when
        while self._sleepers and self._sleepers[0][0] <= when:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance by {seconds}")
        self.move_to(self._now + seconds)

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
