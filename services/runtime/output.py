"""Reading a job attempt's output back: the chunks its executors shipped, as a reader sees them.

On a cluster the chunks are in the output stream (services/runtime/logstream.py) and an
attempt is read through an ephemeral pull consumer filtered on its subjects (`JetStreamOutput`);
in one process they are a list (`MemoryOutput`), which whatever runs the workloads ships to.
Either way a reader opens one attempt (from a time, or from its start), fetches chunks as they
come, knows how many stored ones it has not fetched yet, and closes it. What the chunks mean
(offsets shipped twice, replicas' lines, the end markers) is the reader's pure business
(services/api/logs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass, field
from typing import Final, Protocol

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from services.runtime.logstream import END_HEADER, LOG_STREAM, OFFSET_HEADER, attempt_filter
from services.runtime.memory_log import subject_matches

#: The most chunks one fetch returns.
FETCH_BATCH: Final = 256


@dataclass(frozen=True, slots=True)
class Chunk:
    """One shipped piece of a replica's output (`end`: the replica's output is complete)."""

    subject: str
    offset: int
    data: bytes
    end: bool = False


class Chunks(Protocol):
    """One attempt's output, opened for reading."""

    @property
    def pending(self) -> int:
        """How many stored chunks have not been fetched yet (as of the last fetch)."""
        ...

    async def fetch(self, wait_s: float) -> list[Chunk]:
        """The next chunks, waiting up to `wait_s` for one to come; [] if none did."""
        ...

    async def close(self) -> None: ...


class OutputReader(Protocol):
    async def open(self, job_id: str, attempt: int, since: float | None) -> Chunks | None:
        """The attempt's chunks (shipped from `since`, Unix seconds, on; None: all); None when
        nothing holds any output here (no executor has shipped any yet)."""
        ...


@dataclass
class _StreamChunks:
    sub: JetStreamContext.PullSubscription
    js: JetStreamContext
    consumer: str
    pending: int

    async def fetch(self, wait_s: float) -> list[Chunk]:
        try:
            messages = await self.sub.fetch(FETCH_BATCH, timeout=wait_s)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        chunks = []
        for msg in messages:
            headers = msg.headers or {}
            offset = int(headers.get(OFFSET_HEADER, "0"))
            chunks.append(Chunk(msg.subject, offset, msg.data, END_HEADER in headers))
            self.pending = msg.metadata.num_pending or 0
        return chunks

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()
        with contextlib.suppress(Exception):  # ephemeral, but gone now rather than in 30 s
            await self.js.delete_consumer(LOG_STREAM, self.consumer)


@dataclass
class JetStreamOutput:
    js: JetStreamContext

    async def open(self, job_id: str, attempt: int, since: float | None) -> Chunks | None:
        start = None if since is None else datetime.datetime.fromtimestamp(since, datetime.UTC)
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL if since is None else DeliverPolicy.BY_START_TIME,
            opt_start_time=start,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        subject = attempt_filter(job_id, attempt)
        try:
            sub = await self.js.pull_subscribe(subject, stream=LOG_STREAM, config=config)
        except NotFoundError:  # no stream: no executor has shipped any output here yet
            return None
        info = await sub.consumer_info()
        return _StreamChunks(sub, self.js, info.name, info.num_pending or 0)


@dataclass
class _ListChunks:
    output: MemoryOutput
    subject: str
    since: float | None
    #: how many of the output's chunks this reader has gone past
    cursor: int = 0

    @property
    def pending(self) -> int:
        return len(self._mine(self.output.shipped[self.cursor :]))

    async def fetch(self, wait_s: float) -> list[Chunk]:
        grown = self.output.grown
        async with grown:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(grown.wait_for(self._more), wait_s)
        rest = self.output.shipped[self.cursor :][:FETCH_BATCH]
        self.cursor += len(rest)
        return self._mine(rest)

    async def close(self) -> None:
        return None

    def _more(self) -> bool:
        return self.cursor < len(self.output.shipped)

    def _mine(self, shipped: list[tuple[float, Chunk]]) -> list[Chunk]:
        return [
            chunk
            for at, chunk in shipped
            if subject_matches(self.subject, chunk.subject)
            and (self.since is None or at >= self.since)
        ]


@dataclass
class MemoryOutput:
    """Output in one process: every chunk shipped, with when, in order; nothing is dropped."""

    shipped: list[tuple[float, Chunk]] = field(default_factory=list)
    grown: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def ship(self, at: float, chunk: Chunk) -> None:
        """Store `chunk` (its subject: `logstream.log_subject`) as shipped at `at`."""
        async with self.grown:
            self.shipped.append((at, chunk))
            self.grown.notify_all()

    async def open(self, job_id: str, attempt: int, since: float | None) -> Chunks | None:
        return _ListChunks(self, attempt_filter(job_id, attempt), since)
