"""The event log: one JetStream stream that holds every Fairlane event.

- Publishing is idempotent: the event id is the `Nats-Msg-Id`, so a repeat inside the
  stream's duplicate window is dropped (the ack says so) and costs nothing.
- Writes can be fenced: `expect_last_seq` makes the server refuse the write if anything was
  written since the state the decision was computed from (error 10071), so a deposed leader's
  decision never lands.
- Reading is a replay from a sequence, then (with `follow`) the live tail. A message that is not
  a known event is logged with its sequence, counted and skipped, never a crash loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.errors import APIError, NotFoundError

from events import Event, decode_event, encode_event, subject_for
from events.catalogue import AnyEvent
from services.runtime.connection import connect as connect  # noqa: PLC0414 (callers import it here)
from services.runtime.retry import TRANSIENT as TRANSIENT  # noqa: PLC0414 (likewise)
from services.runtime.retry import RetryPolicy

STREAM: Final = "FAIRLANE"
SUBJECTS: Final = ["fl.>"]
WRONG_LAST_SEQUENCE: Final = 10071
log = structlog.get_logger("fairlane.eventlog")


class Conflict(Exception):
    """The stream moved on since the state this write was decided from."""


class ConsumerGone(Exception):
    """The server no longer has the consumer being read (it restarted, or cleaned it up)."""


#: How long one pull request waits for messages before the server ends it (408).
PULL_EXPIRES_S: Final = 5.0
#: A durable reader acks once this many events are handled, or the tail has been quiet for
#: ACK_QUIET_S: an ack per event cost the server 40% more CPU in bench.pipeline.
ACK_EVERY: Final = 500
ACK_QUIET_S: Final = 0.2
#: The status that ends a pull for good: no one serves the consumer's subject (it is gone).
CONSUMER_GONE: Final = frozenset({"503"})


@dataclass(frozen=True, slots=True)
class Stored:
    seq: int
    event: AnyEvent


def durable_name(*parts: str) -> str:
    """A durable consumer's name from its parts (a consumer name allows no '.', '*', '>' or
    spaces): `durable_name("scheduler", host, "4711")` -> `scheduler-host-4711`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(parts))[:200]


class EventLog:
    def __init__(self, nc: Client, stream: str = STREAM, durable: str | None = None) -> None:
        """`durable`: the name of the durable consumer `follow` reads the live tail with (a
        service process's own name); None for an ephemeral one (tools, tests, benchmarks)."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self.durable = durable
        self.skipped = 0  # malformed or unknown messages seen while reading

    async def ensure_stream(self) -> None:
        config = StreamConfig(
            name=self.stream, subjects=SUBJECTS, duplicate_window=120.0, allow_rollup_hdrs=False
        )
        try:
            await self.js.stream_info(self.stream)
        except NotFoundError:
            await self.js.add_stream(config)

    async def last_seq(self) -> int:
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def publish(
        self,
        event: Event,
        *,
        expect_last_seq: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> int:
        """Store one event; returns its stream sequence (the original's, for a duplicate).

        `fence=(subject, seq)` stores it only if `seq` is still the last message on `subject`
        (a leader's term: see services/runtime/lease.py)."""
        headers: dict[str, Any] = {"Nats-Msg-Id": event.id}
        if expect_last_seq is not None:
            headers["Nats-Expected-Last-Sequence"] = str(expect_last_seq)
        if fence is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(fence[1])
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = fence[0]
        try:
            ack = await self.js.publish(
                subject_for(event), encode_event(event), stream=self.stream, headers=headers
            )
        except APIError as e:
            if e.err_code == WRONG_LAST_SEQUENCE:
                raise Conflict(str(e)) from None
            raise
        return int(ack.seq)

    async def publish_durably(
        self, event: Event, *, fence: tuple[str, int] | None = None, give_up_after: float = 300.0
    ) -> int:
        """`publish`, retried through server restarts and timeouts until stored. Safe because
        the event id deduplicates: a retry of a write that did land is dropped. A `Conflict`
        (the fence moved on) is final and raised at once. A full store is waited out too."""
        policy = RetryPolicy(give_up_after_s=give_up_after)
        return await policy.run(lambda: self.publish(event, fence=fence), f"publish {event.id}")

    async def publish_raw(self, subject: str, payload: bytes) -> int:
        """For tests of bad input: put bytes on a stream subject as anyone could."""
        return int((await self.js.publish(subject, payload, stream=self.stream)).seq)

    async def read(self, from_seq: int = 1, batch: int = 5000) -> AsyncIterator[Stored]:
        """Everything stored from `from_seq` up to the end as it is now."""
        end = await self.last_seq()
        if from_seq > end:
            return
        async for stored in self._consume(from_seq, batch, until=end):
            yield stored

    async def follow(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        """Replay from `from_seq`, then the live tail, forever. Survives server restarts: the
        consumer is made again from the last sequence read. `subject` (a filter such as
        `fl.job.*.job_started`) has the server deliver only those events: for readers that
        watch a few kinds, not for a fold, which needs them all.

        With `durable` set, the consumer is durable and acknowledged explicitly: an event is
        acked once it has been handled (the loop body ran for it and came back for the next),
        every ACK_EVERY events or once the tail has been quiet for ACK_QUIET_S, acking the last
        acks all before it (AckPolicy.ALL). So the server's ack floor is the service's progress
        and `nats consumer info` shows how far behind it is. The service's own marker stays
        its last applied sequence: on every (re)start the consumer is made again from there,
        since replay rebuilds the state it describes. Its state is kept in memory: durable
        across reconnects; after a server restart it is made again, like an ephemeral one."""
        next_seq = from_seq
        while True:
            try:
                async for stored in self._consume(
                    next_seq, batch, until=None, subject=subject, durable=self.durable
                ):
                    next_seq = stored.seq + 1
                    yield stored
            except (
                nats.errors.ConnectionClosedError,
                nats.errors.TimeoutError,
                TimeoutError,
                APIError,
                NotFoundError,
                ConsumerGone,
            ) as e:
                log.warning("consumer lost, making it again", error=str(e), from_seq=next_seq)
                await asyncio.sleep(0.2)

    async def _consume(
        self,
        from_seq: int,
        batch: int,
        until: int | None,
        subject: str | None = None,
        durable: str | None = None,
    ) -> AsyncIterator[Stored]:
        """Pull from an ephemeral consumer with hand-made pull requests into a callback
        subscription: nats-py's own `fetch` awaits every message through `wait_for` and two
        tasks, which capped replay at about 34,000 events/s here; this reads 5x faster."""
        if durable is not None:
            # its start is fixed when made: make it again from where this reader is
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(self.stream, durable)
        consumer = await self.js.add_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=durable,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=from_seq,
                ack_policy=AckPolicy.NONE if durable is None else AckPolicy.ALL,
                max_ack_pending=None if durable is None else -1,
                # a durable outlives its reader for an hour, for whoever looks at its progress
                inactive_threshold=30.0 if durable is None else 3600.0,
                mem_storage=True,  # the log is the record; progress is kept by the reader
                filter_subject=subject,
            ),
        )
        arrived: deque[Msg] = deque()
        wake = asyncio.Event()

        async def collect(msg: Msg) -> None:
            arrived.append(msg)
            wake.set()

        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(
            inbox, cb=collect, pending_msgs_limit=4 * batch, pending_bytes_limit=256 << 20
        )
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{consumer.name}"
        request = msgspec.json.encode({"batch": batch, "expires": int(PULL_EXPIRES_S * 1e9)})
        asked = 0  # messages the open pull request may still deliver (0: none open)
        to_ack: str | None = None  # reply subject of the last message handled, not yet acked
        unacked = 0  # messages handled since the last ack
        try:
            while True:
                if asked == 0:
                    await self.nc.publish(next_subject, request, reply=inbox)
                    asked = batch
                if to_ack is not None and not arrived and unacked >= ACK_EVERY:
                    await self.nc.publish(to_ack, b"+ACK")  # all handled so far
                    to_ack, unacked = None, 0
                if not arrived:
                    wake.clear()
                    # an ack waits for more to go with it, but not long once the tail is quiet
                    quiet_ack = to_ack is not None
                    wait_s = ACK_QUIET_S if quiet_ack else PULL_EXPIRES_S + 2.0
                    try:
                        # asyncio.timeout, not wait_for: in Python 3.11 wait_for can swallow a
                        # cancellation that lands as the wait ends, and this loop never would
                        async with asyncio.timeout(wait_s):
                            await wake.wait()
                    except TimeoutError:
                        if quiet_ack and to_ack is not None:
                            await self.nc.publish(to_ack, b"+ACK")
                            to_ack, unacked = None, 0
                        else:
                            asked = 0  # the request was lost (a server restart): ask again
                        continue
                while arrived:
                    msg = arrived.popleft()
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status is not None:
                        asked = 0  # the request ended (expired, or refused)
                        description = headers.get("Description", "")
                        if status in CONSUMER_GONE or description == "Consumer Deleted":
                            raise ConsumerGone(f"{status} {description}")
                        continue
                    asked -= 1
                    seq = _stream_seq(msg.reply)
                    try:
                        event = decode_event(msg.data)
                    except (msgspec.DecodeError, msgspec.ValidationError) as e:
                        self.skipped += 1
                        log.warning(
                            "skipped a message that is not an event",
                            seq=seq,
                            subject=msg.subject,
                            error=str(e),
                        )
                    else:
                        yield Stored(seq, event)
                    if durable is not None:
                        to_ack = msg.reply  # handled: the reader came back for the next
                        unacked += 1
                    if until is not None and seq >= until:
                        return
        finally:
            with contextlib.suppress(Exception):  # the connection may be gone already
                await sub.unsubscribe()
            if durable is None:
                with contextlib.suppress(Exception):
                    await self.js.delete_consumer(self.stream, consumer.name)
            elif to_ack is not None:
                with contextlib.suppress(Exception):
                    await self.nc.publish(to_ack, b"+ACK")


def _stream_seq(reply: str) -> int:
    """The stream sequence from a JetStream delivery's reply subject:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
    the newer form with `<domain>.<account hash>` after `$JS.ACK` and a token at the end."""
    tokens = reply.split(".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])
