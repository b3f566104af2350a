"""From trace rows to what the cluster runs: gangs, a virtual clock, and project quotas.

Gangs: a job asking for more GPUs than the largest node of the compute pool (G) becomes
ceil(gpus / G) replicas of gpus / replicas GPUs each. When that does not divide evenly, each
replica is rounded up to ceil(gpus / replicas) GPUs: the job holds up to replicas - 1 GPUs more
than it asked for (counted as `padded_jobs`), since a gang's replicas are all one size. A job
that the pool could not hold even when empty is refused by admission and counted as rejected.

Quotas, unless a file gives them: each project's share of the offered load (GPU-seconds of the
jobs that could fit, gpus x duration) times the compute pool's GPUs, rounded down, and the GPUs
left by rounding go one each to the largest remainders (then the larger load, then the name),
so the quotas add up to the pool exactly. With --quotas FILE, or projects in --cluster FILE,
the projects named there get those terms and every other project quota 0 (it can still borrow
idle GPUs); --quotas wins over the cluster file for a project both name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from events import ProjectTerms
from simulation.trace.cluster import ClusterSpec
from simulation.trace.errors import SimulationError
from simulation.trace.traces import TraceJob

TermsByPool = dict[str, ProjectTerms]


@dataclass(frozen=True, slots=True)
class SimJob:
    job_id: str
    submit_s: float  # on the virtual clock: seconds since the first submission
    duration_s: float
    project: str
    priority: int | None
    replicas: int
    gpus: int  # per replica

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus


@dataclass(frozen=True)
class Workload:
    jobs: list[SimJob]
    #: The trace time at virtual time 0.
    origin_s: float
    projects: dict[str, TermsByPool]
    quota_source: str
    padded_jobs: int


def shape(jobs: list[TraceJob], node_gpus: int) -> tuple[list[SimJob], int]:
    """Gangs on the virtual clock; also how many jobs were padded to equal replicas."""
    origin = jobs[0].submit_s if jobs else 0.0
    shaped, padded = [], 0
    for job in jobs:
        replicas = max(1, math.ceil(job.gpus / node_gpus))
        per_replica = math.ceil(job.gpus / replicas)
        padded += per_replica * replicas != job.gpus
        shaped.append(
            SimJob(
                job_id=job.job_id,
                submit_s=job.submit_s - origin,
                duration_s=job.duration_s,
                project=job.project,
                priority=job.priority,
                replicas=replicas,
                gpus=per_replica,
            )
        )
    return shaped, padded


def build_workload(
    trace_jobs: list[TraceJob],
    cluster: ClusterSpec,
    fits: Callable[[SimJob], bool],
    quotas: Path | None = None,
) -> Workload:
    """`fits` says whether the compute pool could hold a job when empty (admission's test)."""
    if not trace_jobs:
        raise SimulationError("the trace slice has no jobs: widen --from/--to or --projects")
    jobs, padded = shape(trace_jobs, cluster.largest_node)
    names = list(dict.fromkeys(j.project for j in jobs))
    given, source = _given_terms(cluster, quotas)
    if given:
        nothing = {cluster.compute_pool: ProjectTerms()}
        terms = {p: given.get(p, nothing) for p in names} | given
    else:
        load: dict[str, float] = dict.fromkeys(names, 0.0)
        for job in jobs:
            if fits(job):
                load[job.project] += job.total_gpus * job.duration_s
        shares = largest_remainder(load, cluster.gpus)
        terms = {p: {cluster.compute_pool: ProjectTerms(quota=q)} for p, q in shares.items()}
        source = "share of offered load"
    return Workload(jobs, trace_jobs[0].submit_s, terms, source, padded)


def _given_terms(cluster: ClusterSpec, quotas: Path | None) -> tuple[dict[str, TermsByPool], str]:
    """Terms from the cluster file's projects, overridden by the quota file's, and where from."""
    given = {e.name: cluster.terms(e) for e in cluster.projects}
    sources = ["--cluster"] if given else []
    if quotas is not None:
        given |= {p: {cluster.compute_pool: t} for p, t in read_quotas(quotas).items()}
        sources.append("--quotas")
    return given, " and ".join(sources)


def largest_remainder(weights: dict[str, float], total: int) -> dict[str, int]:
    """Whole numbers in proportion to `weights` that add up to `total`."""
    mass = sum(weights.values())
    if mass <= 0:
        return dict.fromkeys(weights, 0)
    exact = {k: w / mass * total for k, w in weights.items()}
    whole = {k: math.floor(v) for k, v in exact.items()}
    by_remainder = sorted(weights, key=lambda k: (-(exact[k] - whole[k]), -weights[k], k))
    for k in by_remainder[: total - sum(whole.values())]:
        whole[k] += 1
    return whole


_TERM_KEYS = ("quota", "over_quota_weight", "limit", "priority")


def read_quotas(path: Path) -> dict[str, ProjectTerms]:
    """`project: quota`, or `project: {quota, over_quota_weight, limit, priority}`."""
    try:
        data = YAML(typ="safe", pure=True).load(path.read_text())
    except OSError as e:
        raise SimulationError(f"--quotas {path}: cannot read it ({e.strerror})") from None
    except YAMLError as e:
        raise SimulationError(f"--quotas {path}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not data:
        raise SimulationError(f"--quotas {path}: expected a mapping of project to quota")
    terms = {}
    for project, value in data.items():
        where = f"--quotas {path}: project {project!r}"
        fields = value if isinstance(value, dict) else {"quota": value}
        unknown = sorted(set(fields) - set(_TERM_KEYS))
        if unknown:
            raise SimulationError(f"{where}: unknown key {unknown[0]!r} ({', '.join(_TERM_KEYS)})")
        for key, number in fields.items():
            negative_ok = key == "priority"
            if (
                isinstance(number, bool)
                or not isinstance(number, int)
                or (number < 0 and not negative_ok)
            ):
                raise SimulationError(f"{where}: {key} must be a whole number >= 0, got {number!r}")
        terms[str(project)] = ProjectTerms(**fields)
    return terms
