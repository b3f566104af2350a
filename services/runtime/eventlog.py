"""The event log: what every service reads and writes (`EventLog`), and its JetStream form:
one stream that holds every Fairlane event (`JetStreamLog`). `services/runtime/memory_log.py`
is the other form, in memory; tests/test_eventlog_contract.py holds both to one contract.

- Publishing is idempotent: the event id is the `Nats-Msg-Id`, so a repeat inside the
  stream's duplicate window is dropped (the ack says so) and costs nothing.
- Writes can be fenced: `expect_last_seq` makes the server refuse the write if anything was
  written since the state the decision was computed from (error 10071), so a deposed leader's
  decision never lands.
- Reading is a replay from a sequence, then (with `follow`) the live tail. A message that is not
  an event is logged with its sequence, counted and skipped, never a crash loop; an event of a
  known type that cannot be read stops the reader (`events.Undecodable`), since a fold that
  skipped it would silently differ from everyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import msgspec
import nats
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.errors import APIError, NotFoundError

from events import (
    Event,
    NotAnEvent,
    Undecodable,
    decode_event,
    encode_event,
    on_its_subject,
    subject_for,
)
from events.catalogue import AnyEvent
from services.runtime.connection import connect as connect  # noqa: PLC0414 (callers import it here)
from services.runtime.connection import on_reconnect
from services.runtime.deliveries import Deliveries
from services.runtime.publisher import Publisher
from services.runtime.retry import TRANSIENT as TRANSIENT  # noqa: PLC0414 (likewise)
from services.runtime.retry import RetryPolicy

STREAM: Final = "FAIRLANE"
SUBJECTS: Final = ["fl.>"]
WRONG_LAST_SEQUENCE: Final = 10071
#: `_consume` up to what matched its filter when its consumer was made
MATCHED: Final = "matched"
log = structlog.get_logger("fairlane.eventlog")


class Conflict(Exception):
    """The stream moved on since the state this write was decided from."""


class UnreadableEvent(Undecodable):
    """`Undecodable`, and where: the sequence and subject of the event that cannot be read."""

    def __init__(self, seq: int, subject: str, error: Undecodable) -> None:
        super().__init__(f"at sequence {seq} ({subject}): {error}")
        self.seq = seq
        self.subject = subject
        self.reason = str(error)


class ConsumerGone(Exception):
    """The server no longer has the consumer being read (it restarted, or cleaned it up)."""


#: How long one pull request waits for messages before the server ends it (408).
PULL_EXPIRES_S: Final = 5.0
#: A durable reader acks once this many events are handled, or the tail has been quiet for
#: ACK_QUIET_S: an ack per event cost the server 40% more CPU in bench.pipeline.
ACK_EVERY: Final = 500
ACK_QUIET_S: Final = 0.2
#: The status that ends a pull for good: no one serves the consumer's subject (it is gone,
#: unless it is there but not serving yet: `_Pull.not_ready_yet`).
CONSUMER_GONE: Final = frozenset({"503"})
NOT_READY_S: Final = 5.0
NOT_READY_WAIT_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Stored:
    seq: int
    event: AnyEvent


class EventLog(Protocol):
    """The log as services use it: idempotent, optionally fenced writes; replay in order;
    follow the tail. Both forms decode through `events.decode_event` and treat bad messages
    alike: garbage is counted (`skipped`) and skipped, a known event that cannot be read
    stops the reader (`events.Undecodable`)."""

    skipped: int

    async def ensure_stream(self) -> None: ...

    async def last_seq(self) -> int: ...

    async def publish(
        self,
        event: Event,
        *,
        expect_last_seq: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> int:
        """Store one event; returns its sequence (the original's, for a repeated id).
        `expect_last_seq`: only if that is still the last sequence of the whole log;
        `fence=(subject, seq)`: only if `seq` is still the last sequence on `subject` (which
        may have wildcards; 0: nothing there yet). Otherwise raises `Conflict`."""
        ...

    async def publish_durably(
        self, event: Event, *, fence: tuple[str, int] | None = None, give_up_after: float = 300.0
    ) -> int:
        """`publish`, retried through passing trouble; a `Conflict` is final."""
        ...

    async def publish_raw(self, subject: str, payload: bytes) -> int:
        """Bytes on a subject as anyone could put them there (for tests of bad input)."""
        ...

    async def last_on(self, subject: str) -> Stored | None:
        """The last event on `subject`, if there is one and it is an event."""
        ...

    def read(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        """Everything stored from `from_seq` up to the end as it is now; with `subject` (a
        filter with wildcards), only the events stored on matching subjects."""
        ...

    def follow(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        """Replay from `from_seq`, then the live tail, forever; with `subject` (a filter with
        wildcards), only the events stored on matching subjects."""
        ...


def stored_or_skip(seq: int, subject: str, data: bytes) -> Stored | None:
    """The event in a stored message, or None for garbage (logged; the caller counts it).
    Raises `Undecodable` for a known event type that cannot be read: skipping it would fold
    a different state from everyone else's."""
    try:
        event = decode_event(data)
    except NotAnEvent as e:
        log.warning(
            "skipped a message that is not an event", seq=seq, subject=subject, error=str(e)
        )
        return None
    except Undecodable as e:
        log.error("stopped at an unreadable event", seq=seq, subject=subject, error=str(e))
        raise UnreadableEvent(seq, subject, e) from None
    if not on_its_subject(subject, event):
        # the server let its writer write there, not say what it says: a node's report on
        # another node's subject (or naming another node) is skipped by every reader alike
        log.warning("skipped a node's report on a subject not its node's", seq=seq, subject=subject)
        return None
    return Stored(seq, event)


class JetStreamLog:
    def __init__(
        self,
        nc: Client,
        stream: str = STREAM,
        durable: str | None = None,
        subjects: list[str] = SUBJECTS,
        subject_of: Callable[[Event], str] = subject_for,
    ) -> None:
        """`durable`: the name of the durable consumer `follow` reads the live tail with (a
        service process's own name); None for an ephemeral one (tools, tests, benchmarks).
        `subjects`: the stream's, where this log makes it; `subject_of`: where each event is
        written (another stream than the log: services/runtime/relays.py)."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self.durable = durable
        self.subjects = subjects
        self.subject_of = subject_of
        self.skipped = 0  # malformed or unknown messages seen while reading
        self.publisher = Publisher(nc)
        # A replicated stream takes one write fenced on a subject at a time: it refuses a
        # second while the first is in flight (10164), so this client sends its own one after
        # the other (a decider's window of placements would otherwise lose all but one).
        self._fenced_one_at_a_time = False
        self._fence_locks: dict[str, asyncio.Lock] = {}

    async def drop_durable(self) -> None:
        """Delete this reader's durable consumer (a service stopping for good: nobody reads
        it, and the server would keep it for an hour)."""
        if self.durable is not None:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(self.stream, self.durable)

    async def ensure_stream(self) -> None:
        config = StreamConfig(
            name=self.stream,
            subjects=self.subjects,
            duplicate_window=120.0,
            allow_rollup_hdrs=False,
        )
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            info = await self.js.add_stream(config)
        self._fenced_one_at_a_time = (info.config.num_replicas or 1) > 1

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
            if self._fenced_one_at_a_time:
                lock = self._fence_locks.setdefault(fence[0], asyncio.Lock())
                async with lock:
                    return await self._store(event, headers)
        return await self._store(event, headers)

    async def _store(self, event: Event, headers: dict[str, Any]) -> int:
        headers["Nats-Expected-Stream"] = self.stream
        try:
            return await self.publisher.publish(
                self.subject_of(event), encode_event(event), headers
            )
        except APIError as e:
            if e.err_code == WRONG_LAST_SEQUENCE:
                raise Conflict(str(e)) from None
            raise

    async def publish_durably(
        self, event: Event, *, fence: tuple[str, int] | None = None, give_up_after: float = 300.0
    ) -> int:
        """`publish`, retried through server restarts and timeouts until stored. Safe because
        the event id deduplicates: a retry of a write that did land is dropped. A `Conflict`
        (the fence moved on) is final and raised at once. A full store is waited out too."""
        policy = RetryPolicy(give_up_after_s=give_up_after)
        return await policy.run(lambda: self.publish(event, fence=fence), f"publish {event.id}")

    async def last_on(self, subject: str) -> Stored | None:
        """The last event stored on `subject` (None if there is none, or it is not an event)."""
        try:
            msg = await self.js.get_last_msg(self.stream, subject)
        except NotFoundError:
            return None
        return stored_or_skip(int(msg.seq or 0), subject, msg.data or b"")

    async def publish_raw(self, subject: str, payload: bytes) -> int:
        """For tests of bad input: put bytes on a stream subject as anyone could."""
        return int((await self.js.publish(subject, payload, stream=self.stream)).seq)

    async def read(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        """Everything stored from `from_seq` up to the end as it is now. With `subject`, only
        what is on matching subjects, read through this log's durable consumer where it has
        one (so a reader allowed only its own consumer and subject can replay: an executor),
        up to what matched when the consumer was made."""
        if subject is None:
            end = await self.last_seq()
            if from_seq > end:
                return
            async for stored in self._consume(from_seq, batch, until=end):
                yield stored
            return
        async for stored in self._consume(
            from_seq, batch, until=MATCHED, subject=subject, durable=self.durable
        ):
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
        until: int | Literal["matched"] | None,
        subject: str | None = None,
        durable: str | None = None,
    ) -> AsyncIterator[Stored]:
        """Pull from a consumer with hand-made pull requests whose deliveries go straight into
        a queue (services/runtime/deliveries.py): nats-py's own `fetch` awaits every message
        through `wait_for` and two tasks, which capped replay at about 34,000 events/s here.
        `until`: up to that stream sequence; MATCHED: up to the messages that matched when the
        consumer was made; None: forever."""
        pull = await _Pull.open(self, from_seq, batch, subject, durable)
        matched = until == MATCHED
        left = pull.matched
        try:
            while not matched or left > 0:
                if pull.asked == 0 or pull.ack_due():
                    await pull.ask()
                if not pull.arrived:
                    await pull.wait()
                    continue
                while pull.arrived:
                    try:
                        delivery = pull.take()
                    except ConsumerGone:
                        if not await pull.not_ready_yet():
                            raise
                        break  # ask again
                    if delivery is None:
                        continue
                    subject_bytes, reply, data = delivery
                    seq = _stream_seq(reply)
                    stored = stored_or_skip(seq, subject_bytes.decode(), data)
                    if stored is None:
                        self.skipped += 1
                    else:
                        yield stored
                    pull.handled(reply)  # the reader came back for the next
                    left -= 1
                    if (isinstance(until, int) and seq >= until) or (matched and left <= 0):
                        return
        finally:
            await pull.close()


#: what the server delivers: subject, reply subject (b"" for a status), data, header block
_Delivery = tuple[bytes, bytes, bytes, bytes | None]


class _Pull:
    """One consumer read through pull requests: what is asked, what arrived, what to ack."""

    def __init__(
        self, log: JetStreamLog, consumer: str, batch: int, durable: bool, matched: int = 0
    ) -> None:
        self.nc, self.js, self.stream = log.nc, log.js, log.stream
        self.consumer, self.batch, self.durable = consumer, batch, durable
        self.arrived: deque[_Delivery] = deque()
        self.loop = asyncio.get_running_loop()
        self.waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self.waiting_until = 0.0  # the loop's time the reader stops waiting at
        self.timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.inbox = self.nc.new_inbox()
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{consumer}"
        self.request = msgspec.json.encode({"batch": batch, "expires": int(PULL_EXPIRES_S * 1e9)})
        self.asked = 0  # messages the open pull request may still deliver (0: none open)
        self.to_ack: bytes | None = None  # reply subject of the last message handled, not acked
        self.unacked = 0  # messages handled since the last ack
        self.deliveries: Deliveries | None = None
        self.matched = matched  # messages matching the filter when the consumer was made
        self.not_ready = 0  # 503s in a row for a consumer that is there (`not_ready_yet`)
        self.reconnected = False  # since the reader last waited: its request may be lost
        self.stop_listening = on_reconnect(self.nc, self._reconnected)

    @classmethod
    async def open(
        cls, log: JetStreamLog, from_seq: int, batch: int, subject: str | None, durable: str | None
    ) -> _Pull:
        if durable is not None:
            # its start is fixed when made: make it again from where this reader is
            with contextlib.suppress(NotFoundError):
                await log.js.delete_consumer(log.stream, durable)
        consumer = await log.js.add_consumer(
            log.stream,
            ConsumerConfig(
                # named, so that the request's subject names the consumer and its filter: what
                # a reader's permissions can restrict (an executor: its own node's work)
                name=durable,
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
        pull = cls(log, consumer.name, batch, durable is not None, consumer.num_pending or 0)
        pull.deliveries = await Deliveries.subscribe(pull.nc, pull.inbox, pull.deliver)
        return pull

    def deliver(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A message for this reader, as it is read off the socket."""
        self.arrived.append((subject, reply, data, headers))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def ack_due(self) -> bool:
        return self.unacked >= ACK_EVERY and not self.arrived

    async def ask(self) -> None:
        """A pull request if none is open; an ack if enough was handled and nothing waits."""
        if self.asked == 0:
            await self.nc.publish(self.next_subject, self.request, reply=self.inbox)
            self.asked = self.batch
        if self.ack_due():
            await self.ack()

    async def wait(self) -> None:
        """Until messages arrive. An ack waits for more to go with it, but not long once the
        tail is quiet; a request that brings nothing for too long was lost (a server restart).
        One timer serves many waits: it is moved only when it would go off too late, and
        when it goes off early it looks again (a timer per wait, made and cancelled for every
        few events of a live tail, was a share of a service's CPU)."""
        quiet_ack = self.to_ack is not None
        self.waiting_until = self.loop.time() + (ACK_QUIET_S if quiet_ack else PULL_EXPIRES_S + 2.0)
        if self.timer is None or self.timer.when() > self.waiting_until:
            self._set_timer()
        self.timed_out = False
        self.waiter = self.loop.create_future()
        try:
            if not self.reconnected:
                await self.waiter
        finally:
            self.waiter = None
        if self.reconnected:
            self.reconnected = False
            self.asked = 0  # the request went with the old connection: ask again now
        elif self.timed_out:
            if quiet_ack:
                await self.ack()
            else:
                self.asked = 0  # ask again

    def _set_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(self.waiting_until, self._time_is_up)

    def _reconnected(self) -> None:
        """The connection is back (`on_reconnect`): the open pull request may have gone
        with the old one, and a waiting reader asks again at once. If it had not gone, the
        two requests' deliveries both come to this reader's inbox, in order."""
        self.reconnected = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _time_is_up(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait sets a timer of its own
        if self.loop.time() < self.waiting_until:
            self._set_timer()  # a later wait's: not yet
            return
        self.timed_out = True
        waiter.set_result(None)

    def take(self) -> tuple[bytes, bytes, bytes] | None:
        """The next delivery (subject, reply, data); None for a status that ends a pull
        request. Every stored message comes with its ack subject as reply, and a status
        without one: a stored message's own headers are never read as a status."""
        subject, reply, data, headers = self.arrived.popleft()
        if reply:
            # never below 0 (an earlier request's deliveries after asking again): at 0 the
            # reader asks again
            self.asked = max(0, self.asked - 1)
            self.not_ready = 0
            return subject, reply, data
        self.asked = 0  # the request ended (expired, or refused)
        status, description = _status(headers)
        if status in CONSUMER_GONE or description == "Consumer Deleted":
            raise ConsumerGone(f"{status} {description}")
        return None

    async def not_ready_yet(self) -> bool:
        """After a 503: whether the consumer is there all the same, only not serving pull
        requests yet (a replicated stream's consumer whose leader is still being chosen, seen
        on a three-server cluster right after it was made): then a moment's wait, and the
        reader asks again, for up to NOT_READY_S in a row."""
        if self.not_ready >= NOT_READY_S / NOT_READY_WAIT_S:
            return False
        try:
            await self.js.consumer_info(self.stream, self.consumer)
        except (NotFoundError, APIError, nats.errors.TimeoutError, TimeoutError):
            return False
        self.not_ready += 1
        await asyncio.sleep(NOT_READY_WAIT_S)
        return True

    def handled(self, reply: bytes) -> None:
        if self.durable:
            self.to_ack = reply
            self.unacked += 1

    async def ack(self) -> None:
        """Ack the last message handled, and with it all before it (AckPolicy.ALL)."""
        if self.to_ack is not None:
            await self.nc.publish(self.to_ack.decode(), b"+ACK")
            self.to_ack, self.unacked = None, 0

    async def close(self) -> None:
        self.stop_listening()
        if self.timer is not None:
            self.timer.cancel()
        # each step on its own: the connection may be gone already
        if self.deliveries is not None:
            await self.deliveries.close()
        with contextlib.suppress(Exception):
            if self.durable:
                await self.ack()
            else:
                await self.js.delete_consumer(self.stream, self.consumer)


def _status(headers: bytes | None) -> tuple[str, str]:
    """A status message's code and description: `NATS/1.0 408 Request Timeout\r\n...`."""
    line = (headers or b"").split(b"\r\n", 1)[0]
    code, _, description = line[len(b"NATS/1.0 ") :].partition(b" ")
    return code.decode(errors="replace"), description.strip().decode(errors="replace")


def _stream_seq(reply: bytes) -> int:
    """The stream sequence from a JetStream delivery's reply subject:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
    the newer form with `<domain>.<account hash>` after `$JS.ACK` and a token at the end."""
    tokens = reply.split(b".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])
