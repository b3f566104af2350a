"""A job attempt's output, read back through the host (services/runtime/output.py).

Executors ship each replica's output in chunks that carry their byte offset; a chunk shipped
twice (an executor restarted mid-way) is skipped here by its offset. With several replicas
each line is prefixed with its replica, whole lines only, so replicas never interleave inside
a line. Following ends once the attempt is over (the read models say so) and every replica
seen has sent its end marker, or FINISH_GRACE_S after the attempt ended if one never does (its
node was lost).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from services.runtime.logstream import replica_of as replica_of_subject
from services.runtime.output import OutputReader

#: While following, how long one fetch waits for new output before looking at the attempt.
POLL_S: Final = 1.0
FINISH_GRACE_S: Final = 5.0
#: The most a plain (not followed) read returns: the end of the output, after a note.
DEFAULT_MAX_BYTES: Final = 8 << 20


@dataclass
class Lines:
    """Turns chunks into output: raw for one replica, or whole lines prefixed per replica."""

    prefixed: bool
    partial: dict[int, bytes] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)

    def take(self, subject: str, offset: int, data: bytes, end: bool) -> bytes:
        if end:
            self.ended.add(subject)
            return self.flush(replica_of_subject(subject))
        shipped, end_at = self.offsets.get(subject, 0), offset + len(data)
        if end_at <= shipped:
            return b""  # shipped twice
        data = data[max(0, shipped - offset) :]
        self.offsets[subject] = end_at
        if not self.prefixed:
            return data
        replica = replica_of_subject(subject)
        text = self.partial.pop(replica, b"") + data
        *whole, rest = text.split(b"\n")
        if rest:
            self.partial[replica] = rest
        return b"".join(_prefix(replica, line) for line in whole)

    def flush(self, replica: int | None = None) -> bytes:
        replicas = [replica] if replica is not None else sorted(self.partial)
        return b"".join(_prefix(r, self.partial.pop(r)) for r in replicas if r in self.partial)

    def all_ended(self) -> bool:
        return set(self.offsets) <= self.ended


def _prefix(replica: int, line: bytes) -> bytes:
    return f"[replica {replica}] ".encode() + line + b"\n"


async def read_output(
    reader: OutputReader,
    job_id: str,
    attempt: int,
    lines: Lines,
    follow: bool,
    attempt_over: Callable[[], Awaitable[bool]],
    since: float | None = None,
) -> AsyncGenerator[bytes, None]:
    """The attempt's output as it was shipped (from `since`, Unix seconds: what was shipped
    from then on, chunk by chunk as the executor sent it), then (following) as it comes,
    until the attempt is over and its output complete."""
    chunks = await reader.open(job_id, attempt, since)
    if chunks is None:
        return
    try:
        over_since: float | None = None
        loop = asyncio.get_running_loop()
        while follow or chunks.pending:
            fetched = await chunks.fetch(POLL_S)
            for chunk in fetched:
                out = lines.take(chunk.subject, chunk.offset, chunk.data, chunk.end)
                if out:
                    yield out
            if fetched or not follow:
                continue
            if over_since is None and await attempt_over():
                over_since = loop.time()
            if over_since is not None and (
                lines.all_ended() or loop.time() - over_since > FINISH_GRACE_S
            ):
                break
        rest = lines.flush()
        if rest:
            yield rest
    finally:
        await chunks.close()


async def tail(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    """The last `max_bytes` of the output (whole chunks), after a note of what was left out."""
    kept: deque[bytes] = deque()
    size = dropped = 0
    async for chunk in chunks:
        kept.append(chunk)
        size += len(chunk)
        while size > max_bytes and len(kept) > 1:
            first = kept.popleft()
            size -= len(first)
            dropped += len(first)
    note = f"[... {dropped} earlier bytes left out ...]\n".encode() if dropped else b""
    return note + b"".join(kept)
