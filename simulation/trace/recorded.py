"""The workload a cluster's log recorded, as a trace the simulator can replay under other
settings (`fairlane whatif`).

From the log: each job's submission time, project, priority and size (as admission resolved
them); its run time, the work it did: the time it ran in the attempt that ended it, plus the
time of earlier attempts that were stopped with a checkpoint (a restart from scratch redoes
the work, so an attempt stopped without one adds nothing); the nodes, pools and settings of the
cluster; and each project's terms. A job still running when the log ends counts the work done
so far; a job that never started has no known run time and is left out (and counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events import (
    ClusterConfigured,
    Event,
    JobAdmitted,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
)
from events.model import ClusterSettings
from simulation.spec import NodeEntry, PoolEntry, ProjectEntry
from simulation.trace.cluster import ClusterSpec
from simulation.trace.errors import SimulationError
from simulation.trace.traces import TraceJob


@dataclass(frozen=True)
class RecordedRun:
    jobs: list[TraceJob]
    cluster: ClusterSpec
    settings: ClusterSettings
    #: project -> pool -> terms, as last configured
    terms: dict[str, dict[str, ProjectTerms]]
    #: jobs that never started: no run time to replay
    left_out: int


@dataclass
class _Job:
    submitted: float
    project: str = ""
    priority: int = 0
    gpus: int = 0
    started: float | None = None
    work_s: float = 0.0
    done: bool = False


@dataclass
class _Reader:
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    pools: list[str] = field(default_factory=list)
    nodes: dict[str, NodeEntry] = field(default_factory=dict)
    terms: dict[str, dict[str, ProjectTerms]] = field(default_factory=dict)
    jobs: dict[str, _Job] = field(default_factory=dict)
    last_time: float = 0.0

    def read(self, event: Event) -> None:
        self.last_time = max(self.last_time, event.time)
        match event:
            case ClusterConfigured(settings=settings):
                self.settings = settings
            case PoolConfigured(pool=pool) if pool not in self.pools:
                self.pools.append(pool)
            case NodeRegistered(node=node, pool=pool, gpus=gpus):
                self.nodes[node] = NodeEntry(node, gpus, pool)
            case NodeLost(node=node):
                self.nodes.pop(node, None)
            case ProjectConfigured(project=project, terms=terms):
                self.terms[project] = dict(terms)
            case _:
                self._job_event(event)

    def _job_event(self, event: Event) -> None:
        match event:
            case JobSubmitted(job_id=job_id):
                self.jobs.setdefault(job_id, _Job(event.time))
            case JobAdmitted(job_id=job_id) if job_id in self.jobs:
                job = self.jobs[job_id]
                job.project, job.priority = event.project, event.priority
                job.gpus = event.gpus * event.replicas
            case JobStarted(job_id=job_id) if job_id in self.jobs:
                self.jobs[job_id].started = event.time
            case JobPreempted(job_id=job_id, replicas=0) if job_id in self.jobs:
                self._stop(self.jobs[job_id], event.time, kept=event.checkpointed, done=False)
            case JobCompleted(job_id=job_id) | JobFailed(job_id=job_id) if job_id in self.jobs:
                self._stop(self.jobs[job_id], event.time, kept=True, done=True)

    @staticmethod
    def _stop(job: _Job, now: float, *, kept: bool, done: bool) -> None:
        if job.started is not None and kept:
            job.work_s += max(0.0, now - job.started)
        job.started = None
        job.done = job.done or done


def recorded_run(log: Iterable[tuple[int, Event]]) -> RecordedRun:
    reader = _Reader()
    for _, event in log:
        reader.read(event)
    jobs: list[TraceJob] = []
    left_out = 0
    for job_id, job in reader.jobs.items():
        work = job.work_s
        if job.started is not None:  # still running when the log ends
            work += reader.last_time - job.started
        if job.gpus <= 0 or work <= 0:
            left_out += 1
            continue
        jobs.append(TraceJob(job_id, job.submitted, work, job.gpus, job.project, job.priority))
    if not reader.nodes:
        raise SimulationError("the log registers no nodes: there is no cluster to replay on")
    jobs.sort(key=lambda j: j.submit_s)
    return RecordedRun(jobs, _cluster(reader), reader.settings, reader.terms, left_out)


def _cluster(reader: _Reader) -> ClusterSpec:
    pools = list(dict.fromkeys([*reader.pools, *(n.pool for n in reader.nodes.values())]))
    compute = reader.settings.default_compute_pool or pools[0]
    entries = tuple(
        PoolEntry(pool, None, tuple(n for n in reader.nodes.values() if n.pool == pool))
        for pool in pools
    )
    projects = tuple(project_entry(name, terms) for name, terms in reader.terms.items())
    fitting = reader.settings.scheduler.fitting
    return ClusterSpec(entries, compute, fitting, projects)


def project_entry(name: str, terms: dict[str, ProjectTerms]) -> ProjectEntry:
    """A project's terms per pool in the scenario format the simulator's cluster takes."""
    limits: dict[str | None, int] = {p: t.limit for p, t in terms.items() if t.limit is not None}
    return ProjectEntry(
        name,
        quota={pool: t.quota for pool, t in terms.items()},
        limit=limits or None,
        over_quota_weight={pool: t.over_quota_weight for pool, t in terms.items()},
        priority={pool: t.priority for pool, t in terms.items()},
    )
