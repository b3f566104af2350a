"""The in-process engine's quiet (simulation/scenario/quiet.py): handed out once nothing else
in the process can run, whatever timers are pending, to a paced service before a driver, one
at a time; and work handed to a thread done on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from simulation.scenario.quiet import DRIVER, InlineExecutor, Quiet


async def test_quiet_comes_after_all_the_work_and_to_a_service_before_the_driver() -> None:
    quiet = Quiet()
    done: list[str] = []

    async def work(name: str, turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)
        done.append(name)

    async def driver() -> None:
        await quiet.until_quiet(DRIVER)
        done.append("driver")

    async def service() -> None:
        await quiet.pace(0.05)
        done.append("service")
        await work("what the service did", 20)  # before the driver's turn comes

    tasks = [asyncio.create_task(quiet.run()), asyncio.create_task(asyncio.sleep(3600))]
    try:
        async with asyncio.timeout(1.0):  # the pending hour-long timer is not waited for
            waiting = asyncio.create_task(driver())
            await asyncio.sleep(0)  # the driver asks first
            paced = asyncio.create_task(service())
            await work("a burst", 50)
            await asyncio.gather(waiting, paced)
    finally:
        for task in tasks:
            task.cancel()
    assert done == ["a burst", "service", "what the service did", "driver"]


async def test_thread_work_is_done_on_the_loop() -> None:
    asyncio.get_running_loop().set_default_executor(InlineExecutor())
    assert await asyncio.to_thread(threading.get_ident) == threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        await asyncio.to_thread(lambda: 1 / 0)
