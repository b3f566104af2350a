"""Work for one node: which applied events a node's executor must see, and what to tell it.

The relay's pure part. `WorkBook.relays` takes an event the fold just applied (with the state right
after it and the fold's verdict) and returns the `WorkRelayed` events to write on `fl-work.<node>`
(the relay stream: services/runtime/relays.py), one per node it concerns: the nodes the job held
replicas on before the event and after it (a lost node: that node, and every node sharing a job with
it). Each relay carries the concerned jobs as the fold left them (`JobWork`), and a placement
carries the job's spec and the attempt's rendezvous (`Rendezvous`: replica 0's node's address, as
the node registered it, and a port chosen here from the log, the same for every replica, new for
each attempt): everything an executor needs, so it folds nothing but its own relays. Refused events
are never relayed: the fold is the referee, the relay is written after it.

`RelayQueue` holds the relays computed but not yet read back from the relay stream, in log
order, and each node's last relay read back: a leader writes them, every watcher (leader or
standby) drops those it then reads back, so a new leader resumes, node by node, exactly where
the relay stream says relaying got to.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

from events import Event, JobScheduled, NodeLost, NodeRegistered, WorkRelayed
from events.catalogue import LOCAL_ADDRESS, RELAYED, JobWork, Rendezvous
from policy.state import ClusterState, Job, Verdict

ACTOR: Final = "nodewatch"
#: Rendezvous ports: from torch's usual 29500 up to Linux's ephemeral range (32768-60999),
#: so the kernel never gives one of them to an outgoing connection.
PORT_BASE: Final = 29500
PORT_SPAN: Final = 32768 - PORT_BASE
ENDED: Final = frozenset({"completed", "failed", "cancelled", "rejected"})


def rendezvous_port(job_id: str, attempt: int, taken: Collection[int]) -> int:
    """The first port not `taken` from a start that the job and the attempt give (the next
    attempt starts one further on): the same for every watcher folding the same log."""
    start = (zlib.crc32(job_id.encode()) + attempt) % PORT_SPAN
    for step in range(PORT_SPAN):
        port = PORT_BASE + (start + step) % PORT_SPAN
        if port not in taken:
            return port
    return PORT_BASE + start  # every port taken at one address: none better to give


#: Room kept under the server's max_payload for a relay's headers (its id and the fence).
HEADER_ROOM: Final = 4096


def oversized(size: int, max_payload: int | None) -> str | None:
    """Why a relay of `size` bytes cannot go on the bus, or None if it can (None: a bus with
    no limit)."""
    if max_payload is None or size <= max_payload - HEADER_ROOM:
        return None
    return (
        f"the relay is {size} bytes, more than the bus carries "
        f"({max_payload} bytes max_payload, less {HEADER_ROOM} for headers)"
    )


def relay_id(node: str, source_seq: int) -> str:
    """A relay's id: a leader that relays the same event to the same node again writes a
    duplicate, which the stream drops."""
    return f"work/{node}/{source_seq}"


def job_work(
    state: ClusterState, job: Job, with_spec: bool, rendezvous: Rendezvous | None = None
) -> JobWork:
    grace = job.spec.grace_s
    return JobWork(
        job_id=job.id,
        attempt=job.attempt,
        phase=job.phase,
        held=tuple(job.held),
        stop_replicas=job.stop_replicas,
        grace_s=grace if grace is not None else state.settings.preemption_grace_s,
        spec=job.spec if with_spec else None,
        rendezvous=rendezvous if with_spec else None,
    )


@dataclass
class WorkBook:
    """Where each job's replicas were after the last event relayed about it."""

    nodes_of: dict[str, frozenset[str]] = field(default_factory=dict)
    jobs_on: dict[str, set[str]] = field(default_factory=dict)
    #: node -> the address it registered
    addresses: dict[str, str] = field(default_factory=dict)
    #: job -> its latest attempt's rendezvous (kept while it waits, so the next differs)
    meets: dict[str, Rendezvous] = field(default_factory=dict)
    #: address -> port -> the job whose running attempt meets there
    ports: dict[str, dict[int, str]] = field(default_factory=dict)

    def relays(
        self, state: ClusterState, seq: int, event: Event, verdict: Verdict
    ) -> list[WorkRelayed]:
        """The relays for `event` at stream sequence `seq`, which the fold (`state`, just
        after it) gave `verdict`; notes where its jobs are now."""
        if not verdict.applied:
            return []
        if isinstance(event, NodeRegistered):
            self.addresses[event.node] = event.address or LOCAL_ADDRESS
        if not isinstance(event, RELAYED):
            return []
        if isinstance(event, NodeLost):
            return self._node_lost(state, seq, event)
        job = state.jobs.get(event.job_id)
        if job is None:
            return []
        nodes = self._move(job)
        placed = isinstance(event, JobScheduled)
        meet = self._meet(job, new=not event.scale_up) if isinstance(event, JobScheduled) else None
        work = (job_work(state, job, with_spec=placed, rendezvous=meet),)
        if job.phase in ENDED:
            self._free(job.id, forget=True)
        return [_relay(node, seq, event, work) for node in sorted(nodes)]

    def _meet(self, job: Job, new: bool) -> Rendezvous | None:
        """The rendezvous of the job's attempt: a new one when it is placed (`new`), else the
        one it was given then (a gang that grows keeps its master)."""
        known = self.meets.get(job.id)
        if not new and known is not None and known.attempt == job.attempt:
            return known
        if not job.held:
            return None
        address = self.addresses.get(job.held[0].node, LOCAL_ADDRESS)
        self._free(job.id)
        at = self.ports.setdefault(address, {})
        taken = at.keys() | ({known.port} if known is not None else set())
        port = rendezvous_port(job.id, job.attempt, taken)
        meet = Rendezvous(attempt=job.attempt, address=address, port=port)
        self.meets[job.id] = meet
        at[port] = job.id
        return meet

    def _free(self, job_id: str, forget: bool = False) -> None:
        """The job's port is free again at its address (`forget`: the job ended)."""
        meet = self.meets.pop(job_id, None) if forget else self.meets.get(job_id)
        if meet is None:
            return
        at = self.ports.get(meet.address, {})
        if at.get(meet.port) == job_id:
            del at[meet.port]
            if not at:
                del self.ports[meet.address]

    def _node_lost(self, state: ClusterState, seq: int, event: NodeLost) -> list[WorkRelayed]:
        concerned: dict[str, list[JobWork]] = {event.node: []}
        for job_id in sorted(self.jobs_on.get(event.node, ())):
            job = state.jobs.get(job_id)
            if job is None:
                continue
            work = job_work(state, job, with_spec=False)
            for node in self._move(job):
                concerned.setdefault(node, []).append(work)
        return [_relay(node, seq, event, tuple(w)) for node, w in sorted(concerned.items())]

    def _move(self, job: Job) -> frozenset[str]:
        """Note where the job is now; the nodes it was on before or is on now."""
        before = self.nodes_of.get(job.id, frozenset())
        after = frozenset(r.node for r in job.held)
        for node in before - after:
            jobs = self.jobs_on.get(node)
            if jobs is not None:
                jobs.discard(job.id)
                if not jobs:
                    del self.jobs_on[node]
        for node in after - before:
            self.jobs_on.setdefault(node, set()).add(job.id)
        if after:
            self.nodes_of[job.id] = after
        else:
            self.nodes_of.pop(job.id, None)
            self._free(job.id)  # it runs nowhere: its port may go to another job
        return before | after


def _relay(node: str, seq: int, event: Event, jobs: tuple[JobWork, ...]) -> WorkRelayed:
    # the source event's time: a relay is the same bytes whichever leader writes it, and it
    # moves no one's clock
    return WorkRelayed(
        id=relay_id(node, seq),
        time=event.time,
        actor=ACTOR,
        causation=event.id,
        node=node,
        source_seq=seq,
        event=event,  # type: ignore[arg-type]  # one of RELAYED, checked above
        jobs=jobs,
    )


RelayKey = tuple[int, str]


def relay_key(relay: WorkRelayed) -> RelayKey:
    return (relay.source_seq, relay.node)


@dataclass
class RelayQueue:
    """Relays computed and not yet read back from the relay stream, in log order, and how far
    each node's relaying got.

    Each node's relays are written in log order, so one read back means every earlier relay
    to its node was written (or set aside): `written` is, per node, the source sequence of
    the last relay read back, and a relay at or below it is never queued or handed out again,
    even one the fold computes only after it was read back (the relay stream is read apart
    from the log, and may be ahead of this watcher's fold)."""

    pending: OrderedDict[str, WorkRelayed] = field(default_factory=OrderedDict)
    #: node -> the source sequence of the last relay to it read back
    written: dict[str, int] = field(default_factory=dict)

    def add(self, relays: Iterable[WorkRelayed]) -> None:
        for relay in relays:
            if not self._behind(relay):
                self.pending[relay.id] = relay

    def seen(self, relay: WorkRelayed) -> None:
        """A relay read back from the relay stream: written, by this leader or an earlier one."""
        self.pending.pop(relay.id, None)
        if relay.source_seq > self.written.get(relay.node, 0):
            self.written[relay.node] = relay.source_seq

    def drop(self, relay_id: str) -> None:
        """A relay some leader set aside (`EventSetAside`): it will never be written."""
        self.pending.pop(relay_id, None)

    def after(self, key: RelayKey | None, limit: int) -> list[WorkRelayed]:
        """Up to `limit` pending relays after `key` (all of them from None), in order, less
        those behind their node's relaying (then dropped)."""
        out: list[WorkRelayed] = []
        behind: list[str] = []
        for relay in self.pending.values():
            if self._behind(relay):
                behind.append(relay.id)
            elif key is None or relay_key(relay) > key:
                out.append(relay)
                if len(out) >= limit:
                    break
        for relay_id in behind:
            del self.pending[relay_id]
        return out

    def _behind(self, relay: WorkRelayed) -> bool:
        return relay.source_seq <= self.written.get(relay.node, 0)
