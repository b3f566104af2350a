"""The policies a simulation can run, each as one of the policy package's schedulers.

- `fair_share`: the default scheduler (quotas, fair shares, reclaim, in-project preemption).
- `priority`: Determined's priority scheduler; a job's priority is the trace's, else 0.
- `fifo`: the priority scheduler with every job at priority 0 and non-preemptible: one queue in
  submission order that never preempts. It backfills (a job that does not fit is skipped and
  later, smaller jobs may start), as Determined's does. Round robin was not chosen: it orders
  by project usage, not by arrival.
- `srtf`, `srsf`, `las`: classic baselines on the priority scheduler. The simulator sets each
  job's priority at submission and records `JobPriorityChanged` at every round boundary, so
  the scheduler (which backfills and preempts strictly lower priorities) becomes:
  * `srtf`: shortest remaining time first: priority = -(seconds of work left), rounded up;
  * `srsf`: shortest remaining service first: priority = -(seconds left x GPUs);
  * `las`: Tiresias-style two-dimensional least attained service: priority = -(queue), where
    the queue is the number of thresholds (GPU-hours) the job's attained service (GPU-seconds
    it has held) has passed; inside a queue, submission order. No starvation guard.
  Work left and attained service are oracle knowledge taken from the simulation itself (the
  published SRTF/SRSF baselines also know job durations).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from events.model import SchedulerType
from simulation.trace.errors import SimulationError
from simulation.trace.workload import SimJob

PolicyName = Literal["fair_share", "priority", "fifo", "srtf", "srsf", "las"]
#: A job's priority now, from its seconds of work done and the GPU-seconds it has held.
Rank = Callable[[SimJob, float, float], int]

DEFAULT_LAS_THRESHOLDS_GPU_H = (1.0, 10.0)


@dataclass(frozen=True)
class Policy:
    name: PolicyName
    scheduler: SchedulerType
    preemptible: bool
    #: Set for the baselines whose priorities change as jobs run.
    rank: Rank | None = None

    def initial_priority(self, job: SimJob) -> int:
        if self.rank is not None:
            return self.rank(job, 0.0, 0.0)
        if self.name == "fifo" or job.priority is None:
            return 0
        return job.priority


def make_policy(
    name: PolicyName, las_thresholds_gpu_h: Sequence[float] = DEFAULT_LAS_THRESHOLDS_GPU_H
) -> Policy:
    match name:
        case "fair_share":
            return Policy(name, "fair_share", preemptible=True)
        case "priority":
            return Policy(name, "priority", preemptible=True)
        case "fifo":
            return Policy(name, "priority", preemptible=False)
        case "srtf":
            return Policy(name, "priority", preemptible=True, rank=_srtf)
        case "srsf":
            return Policy(name, "priority", preemptible=True, rank=_srsf)
        case "las":
            return Policy(name, "priority", preemptible=True, rank=_las(las_thresholds_gpu_h))
    raise SimulationError(f"unknown policy {name!r}")


def _srtf(job: SimJob, done_s: float, attained_gpu_s: float) -> int:
    return -math.ceil(max(0.0, job.duration_s - done_s))


def _srsf(job: SimJob, done_s: float, attained_gpu_s: float) -> int:
    return -math.ceil(max(0.0, job.duration_s - done_s) * job.total_gpus)


def _las(thresholds_gpu_h: Sequence[float]) -> Rank:
    if list(thresholds_gpu_h) != sorted(thresholds_gpu_h) or any(t <= 0 for t in thresholds_gpu_h):
        raise SimulationError(
            f"--las-thresholds must be positive and increasing, got {list(thresholds_gpu_h)}"
        )
    limits = [t * 3600.0 for t in thresholds_gpu_h]

    def rank(job: SimJob, done_s: float, attained_gpu_s: float) -> int:
        return -bisect.bisect_right(limits, attained_gpu_s)

    return rank
