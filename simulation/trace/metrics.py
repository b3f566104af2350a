"""What a simulation measures, read from the events the virtual cluster records.

`Recorder.observe` is the virtual cluster's observer: every event passes through it once, and it
keeps O(1) state per event (per-job records, running totals and a step series of busy GPUs and
waiting jobs). `Recorder.summary()` turns that into the figures the report prints:

- JCT: completion minus submission. Queueing delay: first start minus submission. Waiting:
  all the time a job held no GPUs (queueing plus time back in the queue after preemptions).
- Percentiles are nearest-rank (the ceil(p x n)-th smallest value).
- makespan: the last completion, on the virtual clock (0 is the first submission).
- utilization: GPU-seconds held / (compute pool GPUs x makespan).
- preemptions: `JobPreempted` events that made room for other work (priority or reclaim).
- GPU-hours lost: GPU time held minus the work the jobs needed (duration x GPUs), over the
  completed jobs: work lost since the last checkpoint plus restore time.
- fairness, per project: GPU-hours it held against the GPU-hours of its fair share, the time
  integral of the share the policy's own division (`policy.division.divide`, rule 1)
  gives it from quotas, weights and demand (GPUs of its admitted, unfinished jobs). A ratio
  below 1 means it got less than it was entitled to; demand caps the share, so a project that
  always got what it asked for is at 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from events import (
    Event,
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobPreempted,
    JobPriorityChanged,
    JobRejected,
    JobScheduled,
    JobSubmitted,
    ProjectTerms,
)
from events.catalogue import MAKES_ROOM
from events.units import percentile
from policy.accounts import UNLIMITED
from policy.division import Claim, divide


@dataclass(slots=True)
class JobRecord:
    project: str
    gpus: int  # per replica
    total_gpus: int
    submitted: float
    duration: float
    first_start: float | None = None
    finished: float | None = None
    rejected: str | None = None
    held: int = 0  # GPUs held now
    held_since: float = 0.0
    held_gpu_s: float = 0.0
    preemptions: int = 0

    def attained_gpu_s(self, now: float) -> float:
        return self.held_gpu_s + (now - self.held_since) * self.held


class FairShareMeter:
    """The time integral of each project's fair share in the compute pool.

    Shares are divided again only when demand has changed, and then either at the next moment
    anything happens (`eager`: what a scheduler cycling on every event sees) or when `refresh`
    is called (round mode: at the round boundaries, where its cycles run). A division costs
    tens of microseconds, too much to pay at every event when cycles run only per round.
    """

    def __init__(self, capacity: int, terms: dict[str, ProjectTerms], eager: bool) -> None:
        self.capacity = capacity
        self.terms = terms
        self.eager = eager
        self.demand: dict[str, int] = dict.fromkeys(terms, 0)
        self.share: dict[str, int] = dict.fromkeys(terms, 0)
        self.gpu_s: dict[str, float] = dict.fromkeys(terms, 0.0)
        self._order = {p: i for i, p in enumerate(terms)}
        self._since = 0.0
        self._stale = False

    def change(self, project: str, gpus: int) -> None:
        self.demand[project] = self.demand.get(project, 0) + gpus
        self._stale = True

    def advance(self, now: float) -> None:
        """Every event of instant `now` has been seen."""
        if self.eager:
            self.refresh(now)

    def refresh(self, now: float) -> None:
        """The demand as it is holds from `now` on: divide again if it changed."""
        if not self._stale:
            return
        span = now - self._since
        for project, share in self.share.items():
            self.gpu_s[project] = self.gpu_s.get(project, 0.0) + share * span
        claims = []
        for project, demand in self.demand.items():
            t = self.terms.get(project, ProjectTerms())
            limit = UNLIMITED if t.limit is None else t.limit
            order = self._order.setdefault(project, len(self._order))
            claims.append(
                Claim(project, order, t.quota, t.over_quota_weight, t.priority, min(demand, limit))
            )
        self.share = divide(self.capacity, claims)
        self._since = now
        self._stale = False

    def close(self, now: float) -> None:
        self._stale = True
        self.refresh(now)


@dataclass
class Series:
    """A step function: value[i] holds from time[i] until time[i + 1]."""

    time: list[float] = field(default_factory=list)
    busy_gpus: list[int] = field(default_factory=list)
    waiting_jobs: list[int] = field(default_factory=list)


class Recorder:
    def __init__(
        self,
        capacity: int,
        terms: dict[str, ProjectTerms],
        track_touched: bool = False,
        eager_fair_share: bool = True,
    ) -> None:
        self.capacity = capacity
        self.track_touched = track_touched
        self.quotas = {p: t.quota for p, t in terms.items()}
        self.jobs: dict[str, JobRecord] = {}
        self.fair = FairShareMeter(capacity, terms, eager_fair_share)
        self.series = Series()
        self.now = 0.0
        self.busy = 0
        self.waiting = 0
        self.finished = 0  # completed or rejected: what the progress bar counts
        self.checkpoints = 0
        self.priority_changes = 0
        #: Jobs whose GPUs changed since the last `drain_touched` (their rank may have moved).
        self.touched: set[str] = set()
        self.holding: set[str] = set()
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            JobSubmitted: self._submitted,
            JobAdmitted: self._admitted,
            JobRejected: self._rejected,
            JobScheduled: self._scheduled,
            JobPreempted: self._preempted,
            JobCompleted: self._completed,
            JobCheckpointed: self._checkpointed,
            JobPriorityChanged: self._priority_changed,
        }

    # -- the observer ------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        if event.time > self.now:
            self._step(event.time)
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _step(self, now: float) -> None:
        s = self.series
        if not s.time or (s.busy_gpus[-1], s.waiting_jobs[-1]) != (self.busy, self.waiting):
            s.time.append(self.now)
            s.busy_gpus.append(self.busy)
            s.waiting_jobs.append(self.waiting)
        self.fair.advance(self.now)  # the demand at the end of the instant that just ended
        self.now = now

    def _submitted(self, e: JobSubmitted) -> None:
        spec = e.spec
        self.jobs[e.job_id] = JobRecord(
            project=spec.project,
            gpus=spec.gpus,
            total_gpus=spec.gpus * spec.replicas,
            submitted=e.time,
            duration=spec.duration_s or 0.0,
        )

    def _admitted(self, e: JobAdmitted) -> None:
        job = self.jobs[e.job_id]
        self.waiting += 1
        self.fair.change(job.project, job.total_gpus)

    def _rejected(self, e: JobRejected) -> None:
        self.jobs[e.job_id].rejected = e.reason
        self.finished += 1

    def _scheduled(self, e: JobScheduled) -> None:
        job = self.jobs[e.job_id]
        if not e.scale_up:
            self.waiting -= 1
            if job.first_start is None:
                job.first_start = e.time
        self._hold(e.job_id, job, job.held + len(e.replicas) * job.gpus)

    def _preempted(self, e: JobPreempted) -> None:
        job = self.jobs[e.job_id]
        if e.reason in MAKES_ROOM:
            job.preemptions += 1
        replicas = job.held // job.gpus if job.gpus else 0
        if e.replicas == 0 or e.replicas >= replicas:
            self.waiting += 1
            self._hold(e.job_id, job, 0)
        else:
            self._hold(e.job_id, job, job.held - e.replicas * job.gpus)

    def _completed(self, e: JobCompleted) -> None:
        job = self.jobs[e.job_id]
        self._hold(e.job_id, job, 0)
        job.finished = e.time
        self.finished += 1
        self.fair.change(job.project, -job.total_gpus)

    def _checkpointed(self, e: JobCheckpointed) -> None:
        self.checkpoints += 1

    def _priority_changed(self, e: JobPriorityChanged) -> None:
        self.priority_changes += 1

    def _hold(self, job_id: str, job: JobRecord, gpus: int) -> None:
        job.held_gpu_s += (self.now - job.held_since) * job.held
        self.busy += gpus - job.held
        job.held, job.held_since = gpus, self.now
        if self.track_touched:
            self.touched.add(job_id)
            if gpus:
                self.holding.add(job_id)
            else:
                self.holding.discard(job_id)

    def drain_touched(self) -> set[str]:
        """Jobs that held GPUs at some point since the last call."""
        touched = self.touched | self.holding
        self.touched = set()
        return touched

    # -- the figures -------------------------------------------------------------------------

    def close(self) -> None:
        """The run is over: close the series and the fair-share integral at the last event."""
        self._step(self.now)
        self.fair.close(self.now)

    def jct_s(self) -> list[float]:
        return [j.finished - j.submitted for j in self.jobs.values() if j.finished is not None]

    def summary(self) -> Summary:
        done = [j for j in self.jobs.values() if j.finished is not None]
        jct = self.jct_s()
        queue = [j.first_start - j.submitted for j in done if j.first_start is not None]
        wait = [
            (j.finished - j.submitted) - j.held_gpu_s / j.total_gpus
            for j in done
            if j.finished is not None and j.total_gpus
        ]
        makespan = max((j.finished for j in done if j.finished is not None), default=0.0)
        held = sum(j.held_gpu_s for j in done)
        useful = sum(j.duration * j.total_gpus for j in done)
        rejected = Counter(j.rejected for j in self.jobs.values() if j.rejected is not None)
        return Summary(
            jobs_submitted=len(self.jobs),
            jobs_completed=len(done),
            jobs_rejected=sum(rejected.values()),
            rejected_reasons=dict(rejected.most_common(5)),
            avg_jct_s=_mean(jct),
            p50_jct_s=percentile(jct, 0.5),
            p99_jct_s=percentile(jct, 0.99),
            avg_queue_s=_mean(queue),
            p99_queue_s=percentile(queue, 0.99),
            avg_wait_s=_mean(wait),
            makespan_s=makespan,
            utilization=held / (self.capacity * makespan) if makespan and self.capacity else 0.0,
            preemptions=sum(j.preemptions for j in self.jobs.values()),
            jobs_preempted=sum(1 for j in self.jobs.values() if j.preemptions),
            gpu_hours_held=held / 3600.0,
            gpu_hours_lost=max(0.0, held - useful) / 3600.0,
            checkpoints=self.checkpoints,
            priority_changes=self.priority_changes,
            projects=self._projects(),
        )

    def _projects(self) -> dict[str, ProjectFigures]:
        by_project: dict[str, list[JobRecord]] = {}
        for job in self.jobs.values():
            by_project.setdefault(job.project, []).append(job)
        figures = {}
        for project in sorted(by_project):
            jobs = by_project[project]
            done = [j for j in jobs if j.finished is not None]
            held_h = sum(j.held_gpu_s for j in jobs) / 3600.0
            fair_h = self.fair.gpu_s.get(project, 0.0) / 3600.0
            figures[project] = ProjectFigures(
                jobs=len(jobs),
                completed=len(done),
                quota=self.quotas.get(project, 0),
                gpu_hours=held_h,
                fair_share_gpu_hours=fair_h,
                fair_share_ratio=held_h / fair_h if fair_h > 0 else None,
                avg_jct_s=_mean([j.finished - j.submitted for j in done if j.finished is not None]),
                avg_queue_s=_mean(
                    [j.first_start - j.submitted for j in done if j.first_start is not None]
                ),
                preemptions=sum(j.preemptions for j in jobs),
            )
        return figures


@dataclass
class ProjectFigures:
    jobs: int
    completed: int
    quota: int
    gpu_hours: float
    fair_share_gpu_hours: float
    fair_share_ratio: float | None
    avg_jct_s: float
    avg_queue_s: float
    preemptions: int


@dataclass
class Summary:
    jobs_submitted: int
    jobs_completed: int
    jobs_rejected: int
    rejected_reasons: dict[str, int]
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    p99_queue_s: float
    avg_wait_s: float
    makespan_s: float
    utilization: float
    preemptions: int
    jobs_preempted: int
    gpu_hours_held: float
    gpu_hours_lost: float
    checkpoints: int
    priority_changes: int
    projects: dict[str, ProjectFigures]

    @property
    def fairness(self) -> tuple[float | None, float | None]:
        """(lowest ratio, Jain's index of the ratios) over projects with a fair share."""
        ratios = [p.fair_share_ratio for p in self.projects.values() if p.fair_share_ratio]
        if not ratios:
            return None, None
        jain = sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))
        return min(ratios), jain


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
