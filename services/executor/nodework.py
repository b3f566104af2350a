"""What an executor knows of the log: its own node's relayed work (`fl-work.<node>`), folded.

The node watcher relays every event the fold applied that concerns this node's jobs (or the
node itself), with those jobs as the fold left them (`JobWork`), and a placement with the job's
spec (services/nodewatch/work.py). So this fold referees nothing: it keeps the latest of
each job still holding replicas here, plus the few facts a restarted executor needs: the
placement that started the current attempt (its start's causation) and its first node, the
stop in progress (`StopOrder`: what each node being stopped reports it under) and the
checkpoints reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from events import (
    JobCheckpointed,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    WorkRelayed,
    ids,
)
from events.catalogue import JobWork, PreemptionReason
from events.model import Replica

#: The grace period of a job this executor no longer knows (the cluster's default).
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class StopOrder:
    """A stop in progress: asked for (a preemption request), or begun by a node (its shut
    down, a replica of it lost). Each node holding replicas the stop covers reports its own,
    once they are stopped and stored: the stop's first node (of its first replica, as the
    stop began) under the stop's own id, every other under that id and its name. A lost
    replica's stop has no first node: every node reports under its name, since two nodes may
    each find one of the attempt's replicas lost before either hears of the other."""

    job_id: str
    attempt: int
    reason: PreemptionReason
    report_id: str
    first: str
    targets: tuple[Replica, ...]  # the replicas it stops, as the fold had them
    whole: bool = True
    replicas: int = 0  # as asked (0: the whole job)
    causation: str | None = None

    def report_on(self, node: str) -> str:
        if node == self.first:
            return self.report_id
        return ids.on_node(self.report_id, node)


def requested(request: JobPreemptionRequested, job: JobWork, before: int = 0) -> StopOrder:
    """The stop a request asks for; `job`: as the fold left it right after the request;
    `before`: the replicas it was stopping already (stops of some replicas add up, each
    taking the newest not taken yet)."""
    whole = request.replicas == 0 or request.replicas >= len(job.held)
    n = len(job.held)
    targets = job.held if whole else job.held[n - job.stop_replicas : n - before]
    if not targets:  # `before` not as the fold had it: the newest, as asked
        targets = job.held[n - request.replicas :]
    return StopOrder(
        job_id=request.job_id,
        attempt=request.attempt,
        reason=request.reason,
        report_id=ids.stopped(request.id),
        first=targets[0].node if targets else "",
        targets=tuple(targets),
        whole=whole,
        replicas=request.replicas,
        causation=request.id,
    )


def shutdown_order(job: JobWork, first: str) -> StopOrder:
    """The stop of an attempt for a shut down; `first`: the attempt's first node."""
    return StopOrder(
        job_id=job.job_id,
        attempt=job.attempt,
        reason="shutdown",
        report_id=ids.shut_down(job.job_id, job.attempt),
        first=first,
        targets=job.held,
    )


def lost_order(job: JobWork) -> StopOrder:
    """The stop of an attempt one of whose replicas ended unobserved, with no exit status (a
    reboot, its process group killed from outside): the other replicas stop as a preemption
    stops them, so the next attempt resumes from what each stored."""
    return StopOrder(
        job_id=job.job_id,
        attempt=job.attempt,
        reason="node_lost",
        report_id=ids.lost(job.job_id, job.attempt),
        first="",
        targets=job.held,
    )


def reported_order(job: JobWork, report: JobPreempted, first: str) -> StopOrder | None:
    """The stop another node's report of its own replicas began, where no request did: the
    whole attempt stops and this node reports its own too."""
    if job.stop_replicas < len(job.held):
        return None  # not the whole attempt (a stop of some replicas: requested)
    if report.reason == "node_lost":
        return lost_order(job)
    return shutdown_order(job, first)


class NodeWork:
    """One node's work, folded from its relays (`note`, in log order)."""

    def __init__(self, node: str) -> None:
        self.node = node
        #: jobs holding replicas on this node, as the fold left them
        self.jobs: dict[str, JobWork] = {}
        self.stops: dict[str, list[StopOrder]] = {}
        self.scheduled: dict[str, str] = {}
        #: job -> the node of its current attempt's first replica, as it was placed
        self.firsts: dict[str, str] = {}
        #: job -> (attempt, JobCheckpointed events seen for it, latest of their times)
        self.checkpoints: dict[str, tuple[int, int, float]] = {}
        self.relays = 0  # relays noted
        #: the source sequence of the last relay noted: relays come in log order, so one
        #: at or below it is a repeat (written again after the stream's duplicate window)
        self.source_seq = 0

    def note(self, relay: WorkRelayed) -> bool:
        """Fold one relay; False (and nothing done) for a repeat of one already noted."""
        if relay.node != self.node:
            raise ValueError(f"work for node {relay.node!r} given to {self.node!r}")
        if relay.source_seq <= self.source_seq:
            return False
        self.source_seq = relay.source_seq
        self.relays += 1
        before = {
            j.job_id: self.jobs[j.job_id].stop_replicas for j in relay.jobs if j.job_id in self.jobs
        }
        for job in relay.jobs:
            self._keep(job)
        match relay.event:
            case JobScheduled(scale_up=False) as e:
                self.scheduled[e.job_id] = e.id
                self.stops.pop(e.job_id, None)
                placed = self.jobs.get(e.job_id)
                if placed is not None and placed.held:
                    self.firsts[e.job_id] = placed.held[0].node
            case JobPreemptionRequested() as e if e.job_id in self.jobs:
                order = requested(e, self.jobs[e.job_id], before.get(e.job_id, 0))
                kept = [] if order.whole else self.stops.get(e.job_id, [])
                self.stops[e.job_id] = [o for o in kept if o.attempt == e.attempt] + [order]
            case JobPreempted() as e if self._stop_replicas(e.job_id) == 0:
                self.stops.pop(e.job_id, None)
            case JobPreempted(own_replicas=True) as e if (
                e.job_id not in self.stops and e.job_id in self.jobs
            ):
                first = self.firsts.get(e.job_id, e.node or "")
                begun = reported_order(self.jobs[e.job_id], e, first)
                if begun is not None:
                    self.stops[e.job_id] = [begun]
            case JobCheckpointed() as e:
                attempt, n, last = self.checkpoints.get(e.job_id, (e.attempt, 0, 0.0))
                if attempt != e.attempt:
                    n, last = 0, 0.0
                self.checkpoints[e.job_id] = (e.attempt, n + 1, max(last, e.time))
        return True

    def _keep(self, job: JobWork) -> None:
        if not any(r.node == self.node for r in job.held):
            self.jobs.pop(job.job_id, None)
            self.stops.pop(job.job_id, None)
            self.scheduled.pop(job.job_id, None)
            self.firsts.pop(job.job_id, None)
            self.checkpoints.pop(job.job_id, None)
            return
        known = self.jobs.get(job.job_id)
        if job.spec is None and known is not None and known.spec is not None:
            job = msgspec.structs.replace(job, spec=known.spec)  # relayed with the placement
        if job.rendezvous is None and known is not None and known.rendezvous is not None:
            # relayed with the placement too; only the attempt it was given for keeps it
            if known.rendezvous.attempt == job.attempt:
                job = msgspec.structs.replace(job, rendezvous=known.rendezvous)
        self.jobs[job.job_id] = job

    def _stop_replicas(self, job_id: str) -> int:
        job = self.jobs.get(job_id)
        return job.stop_replicas if job is not None else 0

    def checkpoints_of(self, job_id: str, attempt: int) -> tuple[int, float]:
        seen = self.checkpoints.get(job_id)
        if seen is None or seen[0] != attempt:
            return 0, 0.0
        return seen[1], seen[2]

    def stops_of(self, job_id: str) -> list[StopOrder]:
        """The stops in progress of the job's current attempt."""
        job = self.jobs.get(job_id)
        if job is None or job.stop_replicas == 0:
            return []
        return [o for o in self.stops.get(job_id, []) if o.attempt == job.attempt]

    def grace_of(self, job_id: str) -> float:
        job = self.jobs.get(job_id)
        return job.grace_s if job is not None else DEFAULT_GRACE_S


def desired(job: JobWork | None, attempt: int, replica: Replica) -> bool:
    """Whether the log says this replica of this attempt holds its GPUs (should run, or is
    still being stopped)."""
    return job is not None and job.attempt == attempt and replica in job.held
