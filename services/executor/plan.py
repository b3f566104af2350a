"""The executor's decisions, pure: the log's work for this node and what is here in, actions out.

`plan(work, here, now)` compares what the log wants on this node (`NodeWork`, its relays
folded) with what runs here (`Here`, plain data the actuator keeps) and returns what to do
next: start a replica, SIGTERM or SIGKILL one, store a checkpoint, forget a replica, publish a
report. It reads no clock, file or socket: `now` is given, and every event it asks for is
built here with the ids of `events.ids`, so the same facts give the same actions and ids on
every run (a report made twice is dropped by the stream). The actuator records each action as
it takes it (a replica starting, a stop sent, a report in flight), so the next plan does not
ask for it again: plans are level-triggered, run after every relay and every observation.

A stop ends in a report only once every replica it covers here has ended (or SIGKILL did not
end it within KILL_WAIT_S) and its checkpoint is stored: each node reports its own replicas
(`JobPreempted.own_replicas`), so the fold lets the next attempt start only when every node
stored what the last one saved.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Final, TypeAlias

import msgspec

from events import (
    Event,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobPreempted,
    JobStarted,
    NodeRegistered,
    ids,
)
from events.catalogue import JobWork
from events.model import Replica
from services.executor.facts import AttemptFacts, AttemptKey, Here, ReplicaFacts, ReplicaKey
from services.executor.nodework import (
    NodeWork,
    StopOrder,
    desired,
    lost_order,
    shutdown_order,
)

#: After SIGKILL, how long to wait before reporting the stop anyway.
KILL_WAIT_S: Final = 30.0
#: How long a shut down's report is tried: `fairlane down` keeps the log up until the
#: executors are gone, so this only bounds an executor whose log went away (the next one on
#: the node reports it instead).
SHUTDOWN_REPORT_WITHIN_S: Final = 10.0
REPORT_WITHIN_S: Final = 300.0
#: What an exit code says where the shell's conventions give it a meaning.
EXIT_MEANINGS: Final = {
    125: "the container engine could not run it",
    126: "the command cannot be executed",
    127: "the command was not found",
    137: "killed",
}


@dataclass(frozen=True, slots=True)
class Start:
    job: JobWork
    index: int
    replica: Replica
    announce: bool  # this node reports the attempt's `JobStarted`
    scheduled_id: str | None


@dataclass(frozen=True, slots=True)
class Terminate:
    key: ReplicaKey
    grace_s: float


@dataclass(frozen=True, slots=True)
class Kill:
    key: ReplicaKey


@dataclass(frozen=True, slots=True)
class Store:
    key: ReplicaKey
    after_stop: bool


@dataclass(frozen=True, slots=True)
class Forget:
    key: ReplicaKey


@dataclass(frozen=True, slots=True)
class Report:
    event: Event
    within: float = REPORT_WITHIN_S


@dataclass(frozen=True, slots=True)
class Counted:
    """A `JobCheckpointed` reported: the attempt's count and the marker's time it covers."""

    key: AttemptKey
    checkpoints: int
    last: float


@dataclass(frozen=True, slots=True)
class Register:
    event: NodeRegistered


@dataclass(frozen=True, slots=True)
class ShutdownReported:
    """Every attempt the shut down stopped is reported: the file naming them can go."""


Action: TypeAlias = (
    Start | Terminate | Kill | Store | Forget | Report | Counted | Register | ShutdownReported
)


def plan(work: NodeWork, here: Here, now: float, jobs: Set[str] | None = None) -> list[Action]:
    """What to do next on this node. With `jobs`, only what these jobs need, and the node's
    own actions: every other action is one job's, decided from that job's work and facts
    alone, so a plan after changes that touched a few jobs need not look at the rest (the
    same actions, in the same order, as the whole plan has for them)."""
    actions: list[Action] = []
    actions += starts(work, here, jobs)
    in_order = here.in_order if jobs is None else [r for r in here.in_order if r.job_id in jobs]
    for facts in in_order:
        actions += replica_actions(work, here, facts, now)
    actions += stop_reports(work, here, now, jobs)
    attempts = here.attempts
    for key in sorted(attempts if jobs is None else [k for k in attempts if k[0] in jobs]):
        att = attempts[key]
        actions += announce(work, here, att, now) + checkpoint(work, here, att)
    for facts in in_order:
        actions += messages(here, facts, now)
    actions += register(here, now) + shutdown_reported(work, here)
    return actions


def jobs_of(work: NodeWork, jobs: Set[str] | None) -> list[JobWork]:
    """The log's jobs on this node (those named, or all), in order."""
    if jobs is None:
        return sorted(work.jobs.values(), key=lambda j: j.job_id)
    return sorted((work.jobs[j] for j in jobs if j in work.jobs), key=lambda j: j.job_id)


# -- starting --------------------------------------------------------------------------------


def starts(work: NodeWork, here: Here, jobs: Set[str] | None = None) -> list[Action]:
    """A replica the log holds here that nothing here stands for, and no stop covers."""
    actions: list[Action] = []
    if here.closing or here.lost:
        return actions
    for job in jobs_of(work, jobs):
        fresh = (job.job_id, job.attempt) not in here.attempts
        announce = fresh and job.phase == "starting" and job.held[0].node == here.node
        for index, replica in enumerate(job.held):
            key = (job.job_id, job.attempt, replica)
            if replica.node != here.node or key in here.replicas:
                continue
            if covered(work, here, job, replica):
                continue  # asked to stop before it started: nothing to start
            scheduled = work.scheduled.get(job.job_id)
            actions.append(Start(job, index, replica, announce, scheduled))
    return actions


# -- stopping --------------------------------------------------------------------------------


def orders_of(work: NodeWork, here: Here, job: JobWork) -> list[StopOrder]:
    """The stops of the job's attempt in progress: the log's, and this node's own (its shut
    down, or a replica here lost), where the log stops no whole attempt."""
    # (asked for every job and replica in every plan: most jobs have no stop and nothing ended)
    orders = work.stops_of(job.job_id) if job.stop_replicas else []
    for order in orders:
        if order.whole:
            return orders
    key = (job.job_id, job.attempt)
    if key in here.shut:
        first = work.firsts.get(job.job_id) or job.held[0].node
        return [*orders, shutdown_order(job, first)]
    for r in here.by_attempt.get(key, ()):
        if r.ended and lost_here(r, orders):
            return [*orders, lost_order(job)]
    return orders


def lost_here(r: ReplicaFacts, orders: list[StopOrder]) -> bool:
    """It ended unobserved, with no exit status, while no stop was asked of it."""
    return (
        r.ended
        and r.exit_code is None
        and r.stop_at is None
        and not any(r.replica in o.targets for o in orders)
    )


def mine(order: StopOrder, job: JobWork, node: str) -> list[Replica]:
    """The replicas a stop covers on this node that the fold still has it hold."""
    return [r for r in order.targets if r.node == node and r in job.held]


def covered(work: NodeWork, here: Here, job: JobWork, replica: Replica) -> bool:
    return any(replica in o.targets for o in orders_of(work, here, job))


def replica_actions(work: NodeWork, here: Here, r: ReplicaFacts, now: float) -> list[Action]:
    """Stop what the log no longer wants here, what a stop covers, or everything on a close;
    forget what is over and the log no longer wants."""
    job = work.jobs.get(r.job_id)
    wanted = desired(job, r.attempt, r.replica)
    if (
        wanted
        and here.closing != "stop"
        and (job is None or not covered(work, here, job, r.replica))
    ):
        return []
    if stopped(r, work.grace_of(r.job_id), now):
        return [] if wanted or here.closing else [Forget(r.key)]
    return signals(r, work.grace_of(r.job_id), now)


def signals(r: ReplicaFacts, grace_s: float, now: float) -> list[Action]:
    if r.stop_at is None:
        return [Terminate(r.key, grace_s)]
    if not r.killed and now >= r.stop_at + grace_s:
        return [Kill(r.key)]
    return []


def stopped(r: ReplicaFacts, grace_s: float, now: float) -> bool:
    """Ended, or SIGKILL did not end it within KILL_WAIT_S (reported anyway)."""
    if r.ended:
        return True
    return r.killed and r.stop_at is not None and now >= r.stop_at + grace_s + KILL_WAIT_S


def stop_reports(
    work: NodeWork, here: Here, now: float, jobs: Set[str] | None = None
) -> list[Action]:
    actions: list[Action] = []
    for job in jobs_of(work, jobs):
        for order in in_turn(here, job, orders_of(work, here, job)):
            actions += stop_report(work, here, job, order, now)
    return actions


def in_turn(here: Here, job: JobWork, orders: list[StopOrder]) -> list[StopOrder]:
    """The stops this node may report now: of the stops of some replicas, the first with
    replicas here not yet reported in the log, as the fold gives back a node's newest first
    (each request takes the newest not taken yet)."""
    ready: list[StopOrder] = []
    waiting = False  # an earlier stop of some replicas here is not in the log yet
    for order in orders:
        if order.whole or not waiting:
            ready.append(order)
        if not order.whole and mine(order, job, here.node):
            waiting = waiting or order.report_on(here.node) not in here.published
    return ready


def stop_report(
    work: NodeWork, here: Here, job: JobWork, order: StopOrder, now: float
) -> list[Action]:
    """Once every replica a stop covers here is stopped and stored: this node's report of its
    own replicas of it."""
    targets = mine(order, job, here.node)
    if not targets:
        return []
    report_id = order.report_on(here.node)
    if report_id in here.reported:
        return []
    key = (job.job_id, job.attempt)
    grace = work.grace_of(job.job_id)
    local = [f for r in targets if (f := here.replicas.get((*key, r))) is not None]
    if not all(stopped(f, grace, now) for f in local):
        return []
    unstored = [f for f in local if here.objects and f.has_workload and not f.stored_after_stop]
    if unstored:
        return [Store(f.key, after_stop=True) for f in unstored if not f.storing]
    att = here.attempts.get(key)
    if att is not None and not ready(work, here, att):
        return []
    shut = order.reason == "shutdown" and key in here.shut
    stored = sum(f.stored_bytes for f in local)
    event = JobPreempted(
        id=report_id,
        time=here.shut[key] if shut else now,
        actor=here.actor,
        causation=order.causation,
        job_id=job.job_id,
        attempt=job.attempt,
        reason=order.reason,
        replicas=order.replicas if order.whole else len(targets),
        checkpointed=att is not None and checkpointed(here, att),
        killed=any(f.killed for f in local),
        stored_bytes=stored or None,
        gpu_utilization=att.utilization if att is not None else None,
        node=here.node,
        own_replicas=True,
    )
    within = SHUTDOWN_REPORT_WITHIN_S if order.reason == "shutdown" else REPORT_WITHIN_S
    return [Report(event, within)]


def shutdown_reported(work: NodeWork, here: Here) -> list[Action]:
    if not here.shut:
        return []
    for key in here.shut:
        job = work.jobs.get(key[0])
        if job is None or job.attempt != key[1]:
            continue  # the log is past it: nothing left to report
        wanted = [o.report_on(here.node) for o in orders_of(work, here, job) if o.whole]
        if any(report_id not in here.published for report_id in wanted):
            return []
    return [ShutdownReported()]


# -- the attempt's own reports ---------------------------------------------------------------


def ready(work: NodeWork, here: Here, att: AttemptFacts) -> bool:
    """Whether reports about the attempt may go: its `JobStarted` is in the log, or not this
    node's to make, or the log is past the attempt (the timeline stays in order)."""
    job = work.jobs.get(att.job_id)
    return (
        not att.announce
        or ids.started(att.job_id, att.attempt) in here.published
        or job is None
        or job.attempt != att.attempt
        or job.phase != "starting"
    )


def checkpointed(here: Here, att: AttemptFacts) -> bool:
    """The attempt saved: the workload said so, or the marker was touched since it started."""
    if not here.saves:
        return False
    if att.saved_by_workload:
        return True
    return att.mark is not None and (att.baseline is None or att.mark > att.baseline)


def replicas_of(here: Here, key: AttemptKey) -> list[ReplicaFacts]:
    return list(here.by_attempt.get(key, ()))


def announce(work: NodeWork, here: Here, att: AttemptFacts, now: float) -> list[Action]:
    """`JobStarted`, once every replica of the attempt here was launched; then its ends."""
    key = (att.job_id, att.attempt)
    job = work.jobs.get(att.job_id)
    started = ids.started(*key)
    replicas = replicas_of(here, key)
    if att.announce and started not in here.reported and job is not None:
        if job.attempt == att.attempt and all(r.launched for r in replicas):
            event = JobStarted(
                id=started,
                time=now,
                actor=here.actor,
                causation=att.scheduled_id,
                job_id=att.job_id,
                attempt=att.attempt,
                resumed=att.attempt > 1,
                node=here.node,
            )
            return [Report(event)]
    if not ready(work, here, att):
        return []
    return ends(work, here, att, replicas, now)


def ends(
    work: NodeWork, here: Here, att: AttemptFacts, replicas: list[ReplicaFacts], now: float
) -> list[Action]:
    """A replica that ended by itself, not stopped: lost, failed, or all of them completed."""
    job = work.jobs.get(att.job_id)
    if job is None or here.closing:
        return []
    natural = [
        r
        for r in replicas
        if r.ended
        and r.stop_at is None
        and desired(job, r.attempt, r.replica)
        and not covered(work, here, job, r.replica)
    ]
    if not natural:
        return []
    mine = [r for r in replicas if desired(job, r.attempt, r.replica)]
    for r in natural:  # a replica lost is not one: covered by its stop (`lost_order`)
        if r.exit_code is not None and r.exit_code != 0:
            return report(here, failed(here, att, r, r.exit_code, now))
    if natural and job.held[0].node == here.node and len(natural) == len(mine):
        if all(r.exit_code == 0 for r in natural):
            return report(here, completed(here, att, now))
    return []


def report(here: Here, event: Event) -> list[Action]:
    return [] if event.id in here.reported else [Report(event)]


def failed(here: Here, att: AttemptFacts, r: ReplicaFacts, code: int, now: float) -> JobFailed:
    return JobFailed(
        id=ids.failed(att.job_id, att.attempt),
        time=now,
        actor=here.actor,
        causation=att.scheduled_id,
        job_id=att.job_id,
        attempt=att.attempt,
        exit_code=code,
        reason=failure_reason(here.node, r),
        gpu_utilization=att.utilization,
        node=here.node,
    )


def completed(here: Here, att: AttemptFacts, now: float) -> JobCompleted:
    return JobCompleted(
        id=ids.completed(att.job_id, att.attempt),
        time=now,
        actor=here.actor,
        causation=att.scheduled_id,
        job_id=att.job_id,
        attempt=att.attempt,
        gpu_utilization=att.utilization,
        node=here.node,
    )


def failure_reason(node: str, r: ReplicaFacts) -> str:
    """Why a replica failed: its exit code, what the code means, and what is known of it (the
    runtime's or the executor's word, or else the last line the workload wrote)."""
    said = f"replica {r.index} on {node} exited with code {r.exit_code}"
    if r.exit_code in EXIT_MEANINGS:
        said += f" ({EXIT_MEANINGS[r.exit_code]})"
    return f"{said}: {r.detail}" if r.detail else said


# -- checkpoints -----------------------------------------------------------------------------


def checkpoint(work: NodeWork, here: Here, att: AttemptFacts) -> list[Action]:
    """Store what a running replica saved; then, on the job's first node, `JobCheckpointed`
    for a marker touched since the last one (its time is the marker's)."""
    key = (att.job_id, att.attempt)
    replicas = replicas_of(here, key)
    if not ready(work, here, att):
        return []
    saving = [r for r in replicas if r.unsaved and not r.ended and r.stop_at is None]
    if saving:
        return [Store(r.key, after_stop=False) for r in saving if not r.storing]
    job = work.jobs.get(att.job_id)
    if (
        job is None
        or not here.saves
        or job.attempt != att.attempt
        or job.phase not in ("starting", "running")
        or job.stop_replicas
        or not job.held
        or job.held[0].node != here.node
        or any(r.storing for r in replicas)
        or att.mark is None
        or att.mark <= max(att.last_checkpoint, att.baseline or 0.0)
    ):
        return []
    n = att.checkpoints + 1
    event = JobCheckpointed(
        id=ids.checkpointed(att.job_id, att.attempt, n),
        time=att.mark,
        actor=here.actor,
        job_id=att.job_id,
        attempt=att.attempt,
        size_bytes=replicas[0].size if replicas else None,
        node=here.node,
        refused=bool(replicas) and replicas[0].refused,
    )
    return [Counted(key, n, att.mark), *report(here, event)]


def messages(here: Here, r: ReplicaFacts, now: float) -> list[Action]:
    """Lines on the job's timeline: a checkpoint not fetched, or too large to store."""
    events: list[Event] = []
    if r.fetch_error:
        events.append(
            JobMessage(
                id=ids.checkpoint_not_fetched(r.job_id, r.attempt, r.index),
                time=now,
                actor=here.actor,
                job_id=r.job_id,
                attempt=r.attempt,
                text=f"the checkpoint of replica {r.index} could not be fetched to "
                f"{here.node}: {r.fetch_error}; it starts from what is there",
                node=here.node,
            )
        )
    if (over := r.over_bound) is not None:
        events.append(
            JobMessage(
                id=ids.checkpoint_over_bound(r.job_id, r.attempt, r.index, over.saves, over.mark),
                time=now,
                actor=here.actor,
                job_id=r.job_id,
                attempt=r.attempt,
                text=(
                    f"the checkpoint of replica {r.index} on {here.node} is {over.size} bytes, "
                    f"over the bound of {over.bound} (--checkpoint-max-bytes): not stored; "
                    "an attempt on another node resumes from the last one stored"
                ),
                node=here.node,
            )
        )
    return [a for e in events for a in report(here, e)]


# -- the node --------------------------------------------------------------------------------


def register(here: Here, now: float) -> list[Action]:
    """Declared lost: once everything here stopped, the node offers itself again, empty."""
    if not here.lost or here.offer is None or any(not r.ended for r in here.replicas.values()):
        return []
    again = here.registrations + 1
    event = msgspec.structs.replace(
        here.offer, id=ids.node_registered(here.node, here.boot_id, again), time=now
    )
    return [Register(event)]
