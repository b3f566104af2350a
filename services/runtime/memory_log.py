"""The event log in memory: the same contract as the JetStream one (`EventLog`), for tests,
tools and in-process runs that need no server.

Messages are kept encoded, as a stream keeps them, and read back through the same decoding
(`stored_or_skip`), so versions, garbage and unreadable events behave as they do on JetStream.
Ids are remembered for the log's lifetime (a stream forgets them after its duplicate window;
the per-subject expectation is what makes a repeat safe after that, here as there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from events import Event, encode_event, subject_for
from services.runtime.eventlog import Conflict, Stored, stored_or_skip


@dataclass(frozen=True, slots=True)
class Message:
    subject: str
    data: bytes


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or (token not in ("*", tokens[i])):
            return False
    return len(tokens) == len(wanted)


@dataclass
class MemoryLog:
    messages: list[Message] = field(default_factory=list)  # sequence n is messages[n - 1]
    ids: dict[str, int] = field(default_factory=dict)  # event id -> its sequence
    last_by_subject: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    #: where each event is written (another stream than the log: services/runtime/relays.py)
    subject_of: Callable[[Event], str] = subject_for
    _grew: asyncio.Condition | None = None

    async def ensure_stream(self) -> None:
        return None  # always there

    async def last_seq(self) -> int:
        return len(self.messages)

    async def publish(
        self,
        event: Event,
        *,
        expect_last_seq: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> int:
        if event.id in self.ids:
            return self.ids[event.id]  # a repeat: dropped, answered with the original
        if expect_last_seq is not None and expect_last_seq != len(self.messages):
            raise Conflict(f"wrong last sequence: {len(self.messages)}")
        if fence is not None and self._last_seq_on(fence[0]) != fence[1]:
            raise Conflict(f"wrong last sequence on {fence[0]}: {self._last_seq_on(fence[0])}")
        seq = await self._append(self.subject_of(event), encode_event(event))
        self.ids[event.id] = seq
        return seq

    async def publish_durably(
        self, event: Event, *, fence: tuple[str, int] | None = None, give_up_after: float = 300.0
    ) -> int:
        return await self.publish(event, fence=fence)  # memory does not fail in passing

    async def publish_raw(self, subject: str, payload: bytes) -> int:
        return await self._append(subject, payload)

    async def last_on(self, subject: str) -> Stored | None:
        seq = self._last_seq_on(subject)
        if seq == 0:
            return None
        return stored_or_skip(seq, self.messages[seq - 1].subject, self.messages[seq - 1].data)

    async def read(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        async for stored in self._from(from_seq, until=len(self.messages), subject=subject):
            yield stored

    async def follow(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        async for stored in self._from(from_seq, until=None, subject=subject):
            yield stored

    async def _from(
        self, seq: int, until: int | None, subject: str | None
    ) -> AsyncIterator[Stored]:
        seq = max(seq, 1)
        while until is None or seq <= until:
            if seq > len(self.messages):
                await self._wait_beyond(seq - 1)
                continue
            message = self.messages[seq - 1]
            if subject is None or subject_matches(subject, message.subject):
                stored = stored_or_skip(seq, message.subject, message.data)
                if stored is None:
                    self.skipped += 1
                else:
                    yield stored
            seq += 1

    async def _append(self, subject: str, data: bytes) -> int:
        self.messages.append(Message(subject, data))
        self.last_by_subject[subject] = len(self.messages)
        condition = self._condition()
        async with condition:
            condition.notify_all()
        return len(self.messages)

    async def _wait_beyond(self, seq: int) -> None:
        condition = self._condition()
        async with condition:
            await condition.wait_for(lambda: len(self.messages) > seq)

    def _condition(self) -> asyncio.Condition:
        if self._grew is None:  # made on first use, inside the running loop
            self._grew = asyncio.Condition()
        return self._grew

    def _last_seq_on(self, pattern: str) -> int:
        if "*" not in pattern and ">" not in pattern:
            return self.last_by_subject.get(pattern, 0)
        matching = (
            s for subject, s in self.last_by_subject.items() if subject_matches(pattern, subject)
        )
        return max(matching, default=0)
