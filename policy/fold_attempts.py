"""The fold's handlers for a placed job's attempt: started, asked to stop (all replicas or
some), stopped (by the whole job or node by node), checkpointed, paused and resumed, ended
(completed, failed, cancelled), and the workload's own reports. A report from a node that runs
none of the attempt's replicas is refused."""

from __future__ import annotations

from typing import Final

from events import (
    Event,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobPaused,
    JobPreempted,
    JobPreemptionRequested,
    JobProgress,
    JobResumed,
    JobStarted,
    ids,
)
from events.catalogue import MAKES_ROOM
from policy.cluster_data import UNKNOWN_JOB, ClusterData, Handler, Refusal
from policy.records import FINAL_PHASES, Job, JobPhase


def _job_started(state: ClusterData, e: JobStarted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if e.attempt != job.attempt or job.phase != "starting":
        return "not the job's starting attempt"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    job.phase, job.started_at = "running", e.time
    return None


def _job_preemption_requested(state: ClusterData, e: JobPreemptionRequested) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if e.attempt != job.attempt or not job.held:
        return "not the job's current attempt, or it holds nothing"
    if e.id == job.stop_id:
        return "applied already"
    if e.for_job is not None and e.causation is not None:
        # A stop that makes room stands or falls with the nomination it serves: a victim is
        # never stopped for a nominee whose GPUs the fold did not hold.
        nominee = state.jobs.get(e.for_job)
        if nominee is None or nominee.nomination_id != e.causation:
            return f"its nomination {e.causation} was not applied"
    whole = e.replicas == 0 or e.replicas >= len(job.held)
    # Stops of some replicas add up: two claims in one cycle may each take one of a job's
    # extras, and both requests can be recorded before the executor answers the first.
    more = len(job.held) if whole else job.stop_replicas + e.replicas
    job.stop_replicas = min(len(job.held), more)
    job.stop_reason, job.stop_id = e.reason, e.id
    if whole and job.phase in ("starting", "running"):
        job.phase = "stopping"
    return None


def _job_preempted(state: ClusterData, e: JobPreempted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if e.attempt != job.attempt or not job.held:
        return "not the job's current attempt, or it holds nothing"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    if e.own_replicas and e.node is not None:
        return _node_stopped(state, job, e, e.node)
    whole = e.replicas == 0 or e.replicas >= len(job.held)
    if not whole and job.stop_replicas < e.replicas:
        return "no stop of that many replicas was asked"  # a repeat, or a forgery
    if e.reason in MAKES_ROOM:
        job.preemptions += 1
    if whole:
        state._give_back(job, job.held)
        job.held = []
        state._end_attempt(job, e.time)
    else:
        state._give_back(job, job.held[len(job.held) - e.replicas :])
        del job.held[len(job.held) - e.replicas :]
        job.stop_replicas = max(0, job.stop_replicas - e.replicas)
    if e.checkpointed:
        job.last_checkpoint_at = e.time
    return None


def _node_stopped(state: ClusterData, job: Job, e: JobPreempted, node: str) -> Refusal:
    """One node stopped its own replicas of the stop in progress (and stored what they saved):
    they are given back, and the stop is over only once every node being stopped reported,
    so the next attempt never starts from a checkpoint some node is still storing. A report
    with no stop in progress (a shut down, a replica lost) stops the whole attempt: the other
    nodes see the job stopping and report theirs. Of a stop of some replicas (an elastic
    job's extras), a node reports `e.replicas` of its own: the newest it has being stopped,
    since each request takes the newest not taken yet and a node reports its requests in turn."""
    if job.stop_replicas == 0:
        job.stop_replicas, job.stop_reason = len(job.held), e.reason
        if job.phase in ("starting", "running"):
            job.phase = "stopping"
    whole = job.stop_replicas >= len(job.held)
    stopping = job.held[len(job.held) - job.stop_replicas :]
    mine = [r for r in stopping if r.node == node]
    if not whole and e.replicas:
        mine = mine[len(mine) - e.replicas :] if len(mine) >= e.replicas else []
    if not mine:
        return f"no replica being stopped is on {node}"  # a repeat
    state._give_back(job, mine)
    job.held = [r for r in job.held if r not in mine]
    job.stop_replicas -= len(mine)
    if e.checkpointed:
        job.last_checkpoint_at = e.time
    if e.reason in MAKES_ROOM and _counts(job, e, whole):
        job.preemptions += 1
    if not job.held:
        state._end_attempt(job, e.time)
    return None


def _counts(job: Job, e: JobPreempted, whole: bool) -> bool:
    """Whether this node's report counts the stop as a preemption, once per stop: a whole
    attempt's when its last node reported; each request for some replicas by its first node's
    report, the one under the request's own answer's id (the others add the node's name)."""
    if whole:
        return job.stop_replicas == 0
    return e.causation is not None and e.id == ids.stopped(e.causation)


def _job_checkpointed(state: ClusterData, e: JobCheckpointed) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if e.attempt != job.attempt:
        return "not the job's current attempt"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    job.last_checkpoint_at = e.time
    if e.save_s:
        job.save_s = e.save_s
    return None


def _job_paused(state: ClusterData, e: JobPaused) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase in FINAL_PHASES or job.phase in ("paused", "submitted"):
        return f"job is {job.phase}"
    job.phase = "paused"
    state._drop_nomination(job)
    return None


def _job_resumed(state: ClusterData, e: JobResumed) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase != "paused":
        return f"job is {job.phase}, not paused"
    job.phase, job.pending_since = ("stopping" if job.held else "pending"), e.time
    return None


def _job_ended(
    state: ClusterData, job_id: str, phase: JobPhase, attempt: int | None, node: str | None = None
) -> Refusal:
    job = state.jobs.get(job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase in FINAL_PHASES:
        return f"job is {job.phase} already"
    if attempt is not None and attempt != job.attempt:
        return "not the job's current attempt"
    if (foreign := _foreign_node(job, node)) is not None:
        return foreign
    job.phase = phase
    if phase != "cancelled":
        state._give_back(job, job.held)
        job.held = []  # the workload exited: its GPUs are free now
    state._drop_nomination(job)
    state._settle(job)
    return None


def _job_completed(state: ClusterData, e: JobCompleted) -> Refusal:
    return _job_ended(state, e.job_id, "completed", e.attempt, e.node)


def _job_failed(state: ClusterData, e: JobFailed) -> Refusal:
    return _job_ended(state, e.job_id, "failed", e.attempt, e.node)


def _job_cancelled(state: ClusterData, e: JobCancelled) -> Refusal:
    return _job_ended(state, e.job_id, "cancelled", None)


def _workload_report(state: ClusterData, e: JobProgress | JobMessage) -> Refusal:
    """A workload's own progress or message changes no state; only one from a node that runs
    none of the attempt's replicas is refused (so no read model shows another node's word)."""
    job = state.jobs.get(e.job_id)
    if job is None or e.attempt != job.attempt:
        return None  # as before reports named their node: nothing here to check it against
    return _foreign_node(job, e.node)


def _foreign_node(job: Job, node: str | None) -> Refusal:
    """Why a node's report about the job's current attempt is refused: the node holds no
    replica of it (an executor's credentials reported, for a job running elsewhere, an outcome
    that the node running it then acted on). None when the node has a replica, or the report
    names no node (written before reports named theirs: applied as it always was)."""
    if node is None or any(r.node == node for r in job.held):
        return None
    return f"node {node} holds no replica of attempt {job.attempt}"


HANDLERS: Final[dict[type[Event], Handler]] = {
    JobStarted: _job_started,
    JobPreemptionRequested: _job_preemption_requested,
    JobPreempted: _job_preempted,
    JobCheckpointed: _job_checkpointed,
    JobPaused: _job_paused,
    JobResumed: _job_resumed,
    JobCompleted: _job_completed,
    JobFailed: _job_failed,
    JobCancelled: _job_cancelled,
    JobProgress: _workload_report,
    JobMessage: _workload_report,
}
