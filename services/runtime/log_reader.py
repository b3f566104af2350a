"""The stream read from synchronous code in another thread: for the audit, which pulls the log
one event at a time (policy/audit.py's `Reader`) in a worker thread while the connection lives
on an event loop elsewhere.

Events cross from the loop in batches, so the handoff costs little per event; memory is one
batch, never the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Final, TypeVar

from events import Event
from services.runtime.eventlog import EventLog, Stored

#: events handed from the loop to the reading thread at a time
BATCH: Final = 2_000
T = TypeVar("T")


def blocking_reader(
    log: EventLog, loop: asyncio.AbstractEventLoop, end: int
) -> Callable[[int], Iterator[tuple[int, Event]]]:
    """`read(first)`: the events stored from `first` up to `end`, read on `loop` (which runs in
    another thread) and given to the calling thread in order. Each call reads afresh."""

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def read(first: int) -> Iterator[tuple[int, Event]]:
        if first > end:
            return
        stored = log.read(first)
        try:
            while batch := on_loop(_take(stored, BATCH)):
                for s in batch:
                    if s.seq > end:
                        return
                    yield s.seq, s.event
        finally:  # a reader stopped early (the audit needs no more) lets the stream go
            close = getattr(stored, "aclose", None)
            if close is not None:
                on_loop(close())

    return read


async def _take(stored: AsyncIterator[Stored], count: int) -> list[Stored]:
    batch: list[Stored] = []
    async for s in stored:
        batch.append(s)
        if len(batch) == count:
            break
    return batch
