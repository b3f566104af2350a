"""Stopping asyncio tasks for sure.

On Python 3.11, `asyncio.wait_for` (which nats-py uses while waiting for messages) can swallow a
cancellation that arrives at the same moment as its result, leaving a task that was asked to
stop running on. Cancelling until the task is done closes that gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any], every: float = 0.5) -> None:
    """Cancel `task` until it is done."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every)
    if not task.cancelled():
        task.exception()  # retrieved: whoever cares has seen it already


class Stopped(RuntimeError):
    """A task a service cannot go on without ended."""


async def while_alive(needed: Coroutine[Any, Any, None], work: Awaitable[None], what: str) -> None:
    """Run `work` as long as `needed` (which runs for ever, and which `work` relies on) runs.

    If `needed` ends (failing, or not) `work` is stopped and the failure raised (`Stopped`
    where there was none): a leader whose follower died would go on deciding on a fold that
    no longer moves, so the service stops instead and its supervisor starts it again."""
    needing = asyncio.create_task(needed)
    working = asyncio.ensure_future(work)
    try:
        await asyncio.wait({needing, working}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(working)
        await cancel_and_wait(needing)
    if needing.done() and not needing.cancelled():
        if (error := needing.exception()) is not None:
            raise error
        raise Stopped(f"{what} stopped")
    working.result()


async def until_set(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run `work` until `stop` is set (then it is cancelled), raising its failure if it fails
    first."""
    working = asyncio.create_task(work)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(stopping)
        await cancel_and_wait(working)
    if not working.cancelled():
        working.result()
