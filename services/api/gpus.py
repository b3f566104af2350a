"""The GPUs as their executors last sampled them, joined with the nodes' read model.

Samples are not on the log (services/runtime/gpu_samples.py): this reads each node's latest
value from the host's sample store and puts it beside the node's row (pool, cordon, lost). A node
without a value (its executor does not sample, or stopped more than the bucket's TTL ago)
has its GPUs listed with every reading None: "unknown", never 0. A job's figures are merged
over the nodes it holds GPUs on; it is idle only where every node holding it says so.
Everything here but `read` is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import asyncpg
import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric

from services.api.types import Node
from services.runtime.gpu_samples import GpuSample, GpuSamples, JobGpuUsage, NodeSamples


class GpuView(msgspec.Struct, kw_only=True):
    index: int
    uuid: str = ""
    model: str = ""
    #: percent; None: unknown
    utilization: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    #: the job holding it (None: free, or a job of a project the token does not cover)
    job_id: str | None = None
    #: the holding job's project (projects are everyone's to read)
    project: str | None = None
    #: whether a job holds it (also when the job is not shown)
    held: bool = False
    #: the holding job has been idle (all its GPUs at 0%) for the node's idle time
    idle: bool = False


class NodeGpus(msgspec.Struct, kw_only=True):
    node: str
    pool: str
    gpus: int
    free: int
    lost: bool
    cordon: str
    #: "nvml": readings from NVML; "unknown": none (no NVML, or no recent sample)
    source: str
    sampled_at: float | None
    sample_every_s: float | None
    idle_after_s: float | None
    devices: list[GpuView]
    #: the jobs shown holding its GPUs
    jobs: list[str]
    error: str = ""


class JobGpus(msgspec.Struct, kw_only=True):
    job_id: str
    project: str
    attempt: int
    nodes: list[str]
    gpus: int
    #: mean over its GPUs in the last samples (None: unknown)
    utilization: float | None
    #: mean over the attempt's samples so far (None: unknown)
    average: float | None
    idle: bool
    #: since when all its GPUs have been at 0% (None: not now)
    idle_since: float | None


class GpuReport(msgspec.Struct, kw_only=True):
    nodes: list[NodeGpus]
    jobs: list[JobGpus]


def _view(g: GpuSample, project: str | None, shown: bool, idle: bool) -> GpuView:
    return GpuView(
        index=g.index,
        uuid=g.uuid,
        model=g.model,
        utilization=g.utilization,
        memory_used_mb=g.memory_used_mb,
        memory_total_mb=g.memory_total_mb,
        temperature_c=g.temperature_c,
        power_w=g.power_w,
        job_id=g.job_id if shown else None,
        project=project,
        held=g.job_id is not None,
        idle=idle,
    )


def _mean(parts: list[tuple[float | None, int]]) -> float | None:
    """The mean weighted by GPUs, None if any part is unknown."""
    if not parts or any(value is None for value, _ in parts):
        return None
    total = sum(n for _, n in parts)
    return round(sum((value or 0.0) * n for value, n in parts) / total, 1) if total else None


def merge_jobs(
    samples: Iterable[NodeSamples], projects: dict[str, str], shows: Callable[[str], bool]
) -> list[JobGpus]:
    """Each job's figures over the nodes it runs on (jobs of hidden projects left out)."""
    parts: dict[str, list[tuple[str, JobGpuUsage]]] = {}
    for s in samples:
        for usage in s.jobs:
            parts.setdefault(usage.job_id, []).append((s.node, usage))
    merged: list[JobGpus] = []
    for job_id, every in sorted(parts.items()):
        project = projects.get(job_id, "")
        if not shows(project):
            continue
        attempt = max(u.attempt for _, u in every)
        found = [(n, u) for n, u in every if u.attempt == attempt]
        idle = all(u.idle for _, u in found)
        zero = [u.zero_since for _, u in found]
        merged.append(
            JobGpus(
                job_id=job_id,
                project=project,
                attempt=attempt,
                nodes=sorted({n for n, _ in found}),
                gpus=sum(len(u.gpus) for _, u in found),
                utilization=_mean([(u.utilization, len(u.gpus)) for _, u in found]),
                average=_mean([(u.average, len(u.gpus)) for _, u in found]),
                idle=idle,
                idle_since=max(z for z in zero if z is not None)
                if all(z is not None for z in zero)
                else None,
            )
        )
    return merged


def report(
    nodes: list[Node],
    samples: list[NodeSamples],
    projects: dict[str, str],
    shows: Callable[[str], bool],
) -> GpuReport:
    """The nodes with their GPUs' readings, and the jobs' figures. `projects` maps the jobs
    named in the samples to their projects; `shows(project)`: the token covers it."""
    by_node = {s.node: s for s in samples}
    jobs = merge_jobs(samples, projects, shows)
    idle = {j.job_id for j in jobs if j.idle}
    views: list[NodeGpus] = []
    for n in nodes:
        s = by_node.get(n.node)
        sampled = {g.index: g for g in s.gpus} if s is not None else {}
        devices = []
        for index in range(n.gpus):
            g = sampled.get(index, GpuSample(index=index))
            project = projects.get(g.job_id, "") if g.job_id is not None else None
            shown = project is not None and shows(project)
            devices.append(_view(g, project, shown, shown and g.job_id in idle))
        views.append(
            NodeGpus(
                node=n.node,
                pool=n.pool,
                gpus=n.gpus,
                free=n.free,
                lost=n.lost,
                cordon=n.cordon,
                source=s.source if s is not None and not n.lost else "unknown",
                sampled_at=s.time if s is not None else None,
                sample_every_s=s.every_s if s is not None else None,
                idle_after_s=s.idle_after_s if s is not None else None,
                devices=devices,
                jobs=sorted({d.job_id for d in devices if d.job_id is not None}),
                error=s.error if s is not None else "",
            )
        )
    return GpuReport(nodes=views, jobs=jobs)


async def read(
    conn: asyncpg.Connection,
    store: GpuSamples,
    nodes: list[Node],
    shows: Callable[[str], bool],
) -> GpuReport:
    """The report, from the sample store and the read models."""
    samples = await store.read([n.node for n in nodes])
    named = sorted({g.job_id for s in samples for g in s.gpus if g.job_id is not None})
    named += sorted({u.job_id for s in samples for u in s.jobs})
    rows = await conn.fetch(
        "SELECT job_id, project FROM jobs WHERE job_id = ANY($1::text[])", sorted(set(named))
    )
    projects = {r["job_id"]: r["project"] for r in rows}
    return report(nodes, samples, projects, shows)


def families(r: GpuReport) -> list[Metric]:
    """The report as Prometheus families. An unknown reading is left out (absent, not 0);
    `fairlane_gpu_info` lists every GPU with where its readings come from."""
    gpu = ["node", "gpu"]
    info = GaugeMetricFamily(
        "fairlane_gpu_info",
        "Every GPU, with its readings' source",
        labels=[*gpu, "uuid", "model", "source"],
    )
    readings = {
        "utilization": GaugeMetricFamily(
            "fairlane_gpu_utilization_percent", "GPU utilization (NVML), percent", labels=gpu
        ),
        "memory_used": GaugeMetricFamily(
            "fairlane_gpu_memory_used_bytes", "GPU memory in use", labels=gpu
        ),
        "memory_total": GaugeMetricFamily(
            "fairlane_gpu_memory_total_bytes", "GPU memory", labels=gpu
        ),
        "temperature": GaugeMetricFamily(
            "fairlane_gpu_temperature_celsius", "GPU temperature", labels=gpu
        ),
        "power": GaugeMetricFamily("fairlane_gpu_power_watts", "GPU power draw", labels=gpu),
    }
    for n in r.nodes:
        for d in n.devices:
            at = [n.node, str(d.index)]
            info.add_metric([*at, d.uuid, d.model, n.source], 1.0)
            values = {
                "utilization": d.utilization,
                "memory_used": None if d.memory_used_mb is None else d.memory_used_mb << 20,
                "memory_total": None if d.memory_total_mb is None else d.memory_total_mb << 20,
                "temperature": d.temperature_c,
                "power": d.power_w,
            }
            for name, value in values.items():
                if value is not None:
                    readings[name].add_metric(at, float(value))
    job = ["job", "project"]
    now = GaugeMetricFamily(
        "fairlane_job_gpu_utilization_percent", "A job's GPUs' mean utilization", labels=job
    )
    average = GaugeMetricFamily(
        "fairlane_job_gpu_utilization_average_percent",
        "A job's GPUs' mean utilization over its current attempt",
        labels=[*job, "attempt"],
    )
    idle = GaugeMetricFamily(
        "fairlane_job_gpu_idle", "1 if all a job's GPUs were at 0% for the idle time", labels=job
    )
    for j in r.jobs:
        if j.utilization is not None:
            now.add_metric([j.job_id, j.project], j.utilization)
        if j.average is not None:
            average.add_metric([j.job_id, j.project, str(j.attempt)], j.average)
        idle.add_metric([j.job_id, j.project], 1.0 if j.idle else 0.0)
    return [info, *readings.values(), now, average, idle]
