"""A job attempt's output: the chunks its executors ship, and reading them back.

On a cluster the chunks are in the output stream (services/runtime/logstream.py), shipped with
their offsets in headers, and an attempt is read through an ephemeral pull consumer filtered on
its subjects (`JetStreamOutput`); in one process they are a list (`MemoryOutput`). An executor
ships to either through its host, and asks where an earlier run of it got to.
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

from services.runtime.logstream import (
    END_HEADER,
    LOG_STREAM,
    OFFSET_HEADER,
    attempt_filter,
    ensure_log_stream,
)
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


class OutputWriter(Protocol):
    async def ship(self, at: float, chunk: Chunk) -> None:
        """Store `chunk` (its subject: `logstream.log_subject`), shipped at `at`."""
        ...

    async def shipped_so_far(self, subject: str) -> tuple[int, bool]:
        """Where the shipping on `subject` got to: the offset after its last chunk, and
        whether its end was shipped."""
        ...


class Output(OutputReader, OutputWriter, Protocol):
    """The workloads' output, to ship and to read."""


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
    _made: bool = False

    async def ship(self, at: float, chunk: Chunk) -> None:
        if not self._made:  # where nobody provisioned it (a server without authentication)
            await ensure_log_stream(self.js)
            self._made = True
        headers = {OFFSET_HEADER: str(chunk.offset)} | ({END_HEADER: "1"} if chunk.end else {})
        await self.js.publish(chunk.subject, chunk.data, stream=LOG_STREAM, headers=headers)

    async def shipped_so_far(self, subject: str) -> tuple[int, bool]:
        try:
            last = await self.js.get_last_msg(LOG_STREAM, subject, direct=True)
        except (NotFoundError, nats.errors.NoRespondersError):  # nothing there; no stream yet
            return 0, False
        headers = last.headers or {}
        return int(headers.get(OFFSET_HEADER, "0")) + len(last.data or b""), END_HEADER in headers

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

    async def shipped_so_far(self, subject: str) -> tuple[int, bool]:
        last = next((c for _, c in reversed(self.shipped) if c.subject == subject), None)
        return (0, False) if last is None else (last.offset + len(last.data), last.end)

    async def open(self, job_id: str, attempt: int, since: float | None) -> Chunks | None:
        return _ListChunks(self, attempt_filter(job_id, attempt), since)
