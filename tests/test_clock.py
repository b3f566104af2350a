"""The clocks services decide by: the wall clock, and a virtual one moved by hand."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.runtime.clock import WALL_CLOCK, VirtualClock


async def test_sleepers_wake_in_order_when_the_clock_reaches_them() -> None:
    clock = VirtualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in [("b", 5), ("a", 2), ("c", 5)]]
    await asyncio.sleep(0)
    assert clock.next_due() == 102.0
    clock.move_to(101.0)
    await asyncio.sleep(0)
    assert woke == []  # nobody is due yet: time stands still for them
    clock.move_to(102.0)
    await asyncio.sleep(0)
    assert woke == [("a", 102.0)]
    clock.advance(10.0)
    await asyncio.gather(*tasks)
    assert woke == [("a", 102.0), ("b", 112.0), ("c", 112.0)]  # equal times: in sleeping order
    assert clock.next_due() is None


async def test_a_cancelled_sleeper_is_forgotten() -> None:
    clock = VirtualClock()
    gone = asyncio.create_task(clock.sleep(1.0))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert clock.next_due() is None
    clock.advance(5.0)  # waking a cancelled sleeper would raise InvalidStateError
    assert clock.now() == 5.0


async def test_sleeping_no_time_yields_without_waiting_for_the_clock() -> None:
    clock = VirtualClock()
    await asyncio.wait_for(clock.sleep(0), 1.0)
    assert clock.now() == 0.0


def test_a_virtual_clock_never_goes_back() -> None:
    clock = VirtualClock(start=10.0)
    with pytest.raises(ValueError, match=r"before 10\.0"):
        clock.move_to(9.0)
    with pytest.raises(ValueError, match="-1"):
        clock.advance(-1)


async def test_the_wall_clock_is_the_real_time() -> None:
    before = time.time()
    await WALL_CLOCK.sleep(0.01)
    assert before + 0.01 <= WALL_CLOCK.now() <= time.time()
