"""The node watcher: one fenced leader that declares nodes lost when their heartbeats lapse.

It folds the log (which nodes are registered, and by which registration), watches the
heartbeat bucket, and when a registered node's heartbeat has not changed for the timeout it
publishes `NodeLost`: the fold then frees the node's GPUs and queues its jobs again, so they
run elsewhere. Like the scheduler, it leads through the fenced leader
(services/runtime/leader.py) and fences each `NodeLost` on its term, so a deposed watcher
cannot declare anything. Its clock is its own (given: the wall clock, or a
test's virtual one; heartbeats may lapse on a clock of their own, `lapse_clock`, which the
in-process engine moves apart from the scenario's time): a node is lapsed when this watcher has
not seen its heartbeat's revision change for the timeout; a watcher that just took the lead (or
a node that just registered) gets a full timeout first. (On the wall clock, a host whose time
is stepped forward by more than the timeout would see every node lapse once; hosts slew their
clocks, they do not step them.)
The `NodeLost` id names the registration it ends, so a repeat is dropped and a node that
registers again can be lost again.

While it leads it watches the heartbeats through its host (one watch for every node, not a
read per node each poll): each new revision of a node's heartbeat is when it was last seen.
Each poll, a node the rule finds lapsed is read once more before it is declared, so a
heartbeat the watch has not delivered yet (or missed) still counts: what is declared is
exactly what a read of every node that poll would declare.

Its second duty is the work relay (`services/nodewatch/work.py`): every event the fold applied
that concerns a node's jobs (or the node) is written again on `fl-work.<node>`, in the relay
stream beside the log (services/runtime/relays.py), so each executor reads only its own node's
work and the log's other readers never see it. The leader records its term in the relay stream
too and fences each relay on it. Every watcher computes the relays as it folds, reads the relay
stream back, and drops what was written there; the leader writes the rest, each node's in log
order, so a new leader carries on node by node where the relay stream says relaying stopped
(never from the start): it reads the relay stream up to its own term first, after which no
earlier leader's relay can land. From then until its term ends it stops reading the relay
stream back and drops each relay as the server acks it (reading its own writes back was a
third of what it read); a watcher whose term ended reads on from where it stopped.
"""

from __future__ import annotations

import asyncio
import os

import nats.errors
import structlog
from nats.js.errors import APIError

from events import (
    EventSetAside,
    LeaderElected,
    NodeLost,
    NodeRegistered,
    WorkRelayed,
    encode_event,
    set_aside_id,
    work_subject,
)
from services.nodewatch.rule import lapsed
from services.nodewatch.work import (
    RelayKey,
    RelayQueue,
    WorkBook,
    oversized,
    relay_id,
    relay_key,
)
from services.runtime.clock import WALL_CLOCK, Clock
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.heartbeats import TIMEOUT_S, Heartbeats
from services.runtime.host import Host, nats_host
from services.runtime.leader import FencedLeader, Term
from services.runtime.relays import term_subject
from services.runtime.retry import is_transient
from services.runtime.tasks import cancel_and_wait, until_set, while_alive

log = structlog.get_logger("fairlane.nodewatch")
KIND = "nodewatch"
#: How long a node's heartbeat may lapse before it is lost, where the default (10 s) does not
#: do: tests and benchmarks of hollow nodes, which send none, set it long.
TIMEOUT_ENV = "FAIRLANE_HEARTBEAT_TIMEOUT_S"
#: relays taken from the queue at once
RELAY_BATCH = 256


class NodeWatch:
    def __init__(  # noqa: PLR0913 (its timing, and the parts a test or a process gives it)
        self,
        event_log: EventLog,
        timeout_s: float = TIMEOUT_S,
        lease_ttl_s: float = 3.0,
        clock: Clock = WALL_CLOCK,
        host: Host | None = None,
        lapse_clock: Clock | None = None,
    ) -> None:
        self.log = event_log
        self.timeout_s = timeout_s
        self.poll_s = max(0.1, timeout_s / 10)
        self.clock = clock
        #: what heartbeats lapse on (the events' own time is `clock`'s)
        self.lapse = lapse_clock or clock
        self.host = host = host or nats_host(event_log)
        self.leader = FencedLeader(event_log, host, KIND, clock, ttl_s=lease_ttl_s)
        self.holder = self.leader.holder
        self.follower = Follower(event_log, service=KIND)
        self.relays = host.relays()
        self.relays_read = 0  # the relay stream's last sequence read back
        self._read_back = asyncio.Event()  # set whenever the relay stream was read further
        #: set while this watcher leads and has read the relay stream up to its term: from then
        #: on it knows what it wrote from the server's acks, and reading its own relays back
        #: (a third of what it read) is left until the term ends
        self._leading = asyncio.Event()
        self._led = asyncio.Event()  # set when a term ends
        #: node -> the id of the registration the fold knows it by
        self.registrations: dict[str, str] = {}
        self.last_seen: dict[str, float] = {}
        self.revisions: dict[str, int] = {}
        self.declared = 0
        self.book = WorkBook()
        self.queue = RelayQueue()
        self._queued = asyncio.Event()
        self.relayed = 0  # relays this watcher wrote
        self.set_aside = 0  # relays this watcher set aside

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.relays.ensure_stream()
        # where each node's relaying got to first, so that the fold's replay queues only what
        # was never written
        async for stored in self.relays.read(1):
            self._written(stored)
        await self.follower.catch_up(self._note)
        await while_alive(self._follow(), self.leader.run(self._lead), "the follower")

    async def _follow(self) -> None:
        """The log's tail into the fold, and the relay stream's into what was written."""
        await asyncio.gather(self.follower.run(self._note), self._follow_relays())

    async def _follow_relays(self) -> None:
        """The relay stream read back, except while this watcher leads (see `_leading`)."""
        while True:
            await until_set(self._read_relays(), self._leading)
            while self._leading.is_set():
                await self._led.wait()
                self._led.clear()

    async def _read_relays(self) -> None:
        async for stored in self.relays.follow(self.relays_read + 1):
            self._written(stored)

    def _written(self, stored: Stored) -> None:
        if isinstance(stored.event, WorkRelayed):
            self.queue.seen(stored.event)
        self.relays_read = stored.seq
        self._read_back.set()

    async def _read_relays_to(self, seq: int, within: float = 10.0) -> None:
        """Until the relay stream has been read back up to `seq`."""
        async with asyncio.timeout(within):  # not wait_for: it can swallow a cancellation
            while self.relays_read < seq:
                self._read_back.clear()
                await self._read_back.wait()

    async def _note(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, WorkRelayed):
            return  # an older version's relay, written in the log: not this watcher's to mind
        if isinstance(event, EventSetAside):
            if event.service == KIND:  # that relay will never be written: drop it
                self.queue.drop(relay_id(event.subject.removeprefix(work_subject("")), event.seq))
            return
        relays = self.book.relays(
            self.follower.state, stored.seq, event, self.follower.last_verdict
        )
        if relays:
            self.queue.add(relays)
            self._queued.set()
        if isinstance(event, NodeRegistered):
            self.registrations[event.node] = event.id
            self.last_seen[event.node] = self.lapse.now()  # a full timeout from (re)registering

    async def _lead(self, term: Term) -> None:
        await self.follower.wait_for(term.fence[1])
        relay_fence = await self._relay_term(term)
        # every relay an earlier leader wrote lands before this term's record or not at all
        await self._read_relays_to(relay_fence[1])
        self._leading.set()
        heartbeats = self.host.heartbeats(self.timeout_s)
        started = self.lapse.now()
        self.last_seen = {node: started for node in self.follower.state.nodes}
        duties = [
            asyncio.create_task(self._relay(term.fence, relay_fence)),
            asyncio.create_task(self._watch(heartbeats)),
        ]
        try:
            log.info(
                "watching heartbeats and relaying work",
                holder=self.holder,
                term=term.number,
                timeout_s=self.timeout_s,
                to_relay=len(self.queue.pending),
            )
            while not term.lost.is_set() and not any(d.done() for d in duties):
                await self._declare(term.fence, heartbeats)
                await self._pause(term.lost, duties)
            for duty in duties:
                if duty.done():
                    duty.result()  # each only ends by failing
        finally:
            self._leading.clear()
            self._led.set()  # read back again from where reading stopped, own relays too
            for duty in duties:
                await cancel_and_wait(duty)

    async def _pause(self, lost: asyncio.Event, duties: list[asyncio.Task[None]]) -> None:
        """Until the next poll, or sooner if the lease is lost or a duty ended (with a long
        timeout a poll is minutes away)."""
        sleeping = asyncio.create_task(self.lapse.sleep(self.poll_s))
        losing = asyncio.create_task(lost.wait())
        try:
            await asyncio.wait({sleeping, losing, *duties}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(sleeping)
            await cancel_and_wait(losing)

    async def _relay_term(self, term: Term) -> tuple[str, int]:
        """Record this term in the relay stream; the fence of its relays."""
        elected = LeaderElected(
            id=f"{KIND}/relay-term/{self.holder}/{term.number}",
            time=self.clock.now(),
            actor=self.holder,
            kind=KIND,
            holder=self.holder,
            term=term.number,
        )
        return (term_subject(KIND), await self.relays.publish_durably(elected))

    async def _relay(self, fence: tuple[str, int], relay_fence: tuple[str, int]) -> None:
        """Write the pending relays in order, fenced on this term, until cancelled (`fence`:
        the log's, for a relay set aside; `relay_fence`: the relay stream's)."""
        sent: RelayKey | None = None  # this term starts from whatever is pending
        while True:
            self._queued.clear()
            batch = self.queue.after(sent, RELAY_BATCH)
            if not batch:
                await self._queued.wait()
                continue
            # each node's relays in log order (its executor takes a relay at or below the
            # last it noted for a repeat), different nodes' side by side
            per_node: dict[str, list[WorkRelayed]] = {}
            for relay in batch:
                per_node.setdefault(relay.node, []).append(relay)
            await asyncio.gather(
                *(self._write(chain, fence, relay_fence) for chain in per_node.values())
            )
            sent = relay_key(batch[-1])

    async def _write(
        self, chain: list[WorkRelayed], fence: tuple[str, int], relay_fence: tuple[str, int]
    ) -> None:
        for relay in chain:
            # the server counts headers too, and closes the connection of a client that sends
            # more than max_payload (which reads as a transient error, retried for ever): so
            # the size is checked here, before sending
            too_big = oversized(len(encode_event(relay)), self.host.message_limit())
            if too_big is not None:
                await self._set_aside(relay, too_big, fence)
                continue
            try:
                await self.relays.publish_durably(relay, fence=relay_fence)
            except (nats.errors.MaxPayloadError, APIError) as e:
                if isinstance(e, APIError) and is_transient(e):
                    raise
                await self._set_aside(relay, f"the stream refused the relay: {e!r}", fence)
                continue
            self.queue.seen(relay)  # stored: the ack says so (it is not read back while leading)
            self.relayed += 1

    async def _set_aside(self, relay: WorkRelayed, reason: str, fence: tuple[str, int]) -> None:
        """Record that `relay` will not be written, and go on without it."""
        subject = work_subject(relay.node)
        log.error(
            "relay set aside", seq=relay.source_seq, node=relay.node, id=relay.id, reason=reason
        )
        aside = EventSetAside(
            id=set_aside_id(KIND, relay.source_seq, subject),
            time=relay.time,
            actor=self.holder,
            causation=relay.causation,
            service=KIND,
            seq=relay.source_seq,
            subject=subject,
            reason=reason,
        )
        await self.log.publish_durably(aside, fence=fence)
        self.queue.drop(relay.id)
        self.set_aside += 1

    async def _watch(self, heartbeats: Heartbeats) -> None:
        async for node, revision in heartbeats.watch():
            self._seen(node, revision)
        raise RuntimeError("the heartbeat watch ended")  # a lead without it would lose nodes

    def _seen(self, node: str, revision: int) -> bool:
        """A heartbeat's revision: whether it changed (then the node was seen alive now)."""
        if revision == self.revisions.get(node):
            return False
        self.revisions[node] = revision
        self.last_seen[node] = self.lapse.now()
        return True

    async def _declare(self, fence: tuple[str, int], heartbeats: Heartbeats) -> None:
        nodes = self.follower.state.nodes
        for node in lapsed(nodes, self.last_seen, self.lapse.now(), self.timeout_s):
            revision = await heartbeats.get(node)
            if revision is not None and self._seen(node, revision):
                continue  # it beat after all: the watch had not delivered that one yet
            registration = self.registrations.get(node, f"{node}/registered")
            event = NodeLost(
                id=f"{registration}/lost",
                time=self.clock.now(),
                actor=self.holder,
                node=node,
                reason=f"no heartbeat for {self.timeout_s:g}s",
            )
            log.warning("node lost", node=node, id=event.id)
            await self.log.publish_durably(event, fence=fence)
            self.declared += 1
            self.last_seen[node] = self.lapse.now()  # until the fold has it, do not repeat


def timeout_from_env() -> float:
    """The heartbeat timeout `TIMEOUT_ENV` says, or the default; a clear error for a bad one."""
    said = os.environ.get(TIMEOUT_ENV, "")
    if not said:
        return TIMEOUT_S
    try:
        timeout = float(said)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= 86_400:
        raise SystemExit(f"{TIMEOUT_ENV}={said!r}: not a number of seconds in (0, 86400]")
    return timeout
