"""Stopping asyncio tasks for sure.

On Python 3.11, `asyncio.wait_for` (which nats-py uses while waiting for messages) can swallow a
cancellation that arrives at the same moment as its result, leaving a task that was asked to
stop running on. Cancelling until the task is done closes that gap.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any], every: float = 0.5) -> None:
    """Cancel `task` until it is done."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every)
    if not task.cancelled():
        task.exception()  # retrieved: whoever cares has seen it already
