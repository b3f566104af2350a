"""What the fold keeps of each node, pool, project and job: the records `ClusterState` holds
(policy/cluster_data.py), and the phases a job goes through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from events import ProjectTerms, Replica, SchedulerSettings
from events.model import JobSpec

JobPhase = Literal[
    "submitted",  # waiting for admission
    "pending",  # admitted, holds nothing (a nomination may hold GPUs for it)
    "starting",  # GPUs allocated, workload not yet reported started
    "running",
    "stopping",  # asked to stop (preempted); goes back to pending once stopped
    "paused",
    "completed",
    "failed",
    "cancelled",
    "rejected",
]
FINAL_PHASES: Final = frozenset({"completed", "failed", "cancelled", "rejected"})
HOLDING_PHASES: Final = frozenset({"starting", "running", "stopping"})


@dataclass(slots=True)
class Node:
    name: str
    pool: str
    gpus: int
    order: int
    cordoned: bool = False  # takes no new work (an operator's cordon or drain)


@dataclass(slots=True)
class Pool:
    name: str
    order: int
    scheduler: SchedulerSettings | None = None


@dataclass(slots=True)
class Project:
    name: str
    order: int
    terms: dict[str, ProjectTerms] = field(default_factory=dict)

    def in_pool(self, pool: str) -> ProjectTerms:
        return self.terms.get(pool, _NO_TERMS)


_NO_TERMS: Final = ProjectTerms()


class Job(msgspec.Struct, array_like=True):
    """A job as the fold knows it. A msgspec struct rather than a dataclass so that a snapshot
    of 200,000 jobs decodes straight into jobs, in C (see policy/snapshot.py)."""

    id: str
    seq: int
    spec: JobSpec
    submitted_at: float
    phase: JobPhase = "submitted"
    project: str = ""
    priority: int = 0
    preemptible: bool = True
    gpus: int = 1
    replicas: int = 1
    min_replicas: int = 1
    pools: tuple[str, ...] = ()
    node: str | None = None
    preemption_delay_s: float = 0.0
    min_runtime_s: float = 0.0
    reject_reason: str = ""
    #: the log position of the rejection (its stream sequence under a follower)
    rejected_at: int = 0
    #: for a job id used again after a rejection: that rejection's position
    resubmitted_after: int = 0
    # -- the current attempt
    attempt: int = 0
    pool: str | None = None
    held: list[Replica] = msgspec.field(default_factory=list)
    started_at: float | None = None
    pending_since: float = 0.0
    stop_replicas: int = 0  # replicas asked to stop; equal to len(held) for the whole job
    stop_reason: str = ""
    lost_node: bool = False
    # -- a nomination: GPUs held for this job while victims stop
    nomination: tuple[Replica, ...] = ()
    nomination_pool: str | None = None
    nominations: int = 0
    #: the id of the nomination the fold accepted (the causation of its victims' stop requests)
    nomination_id: str = ""
    #: the id of the last nomination counted, applied or refused (a repeat counts once)
    last_nomination_id: str = ""
    #: the id of the last stop request applied (a repeat of it has no second effect)
    stop_id: str = ""
    # -- history the policy weighs
    preemptions: int = 0
    last_checkpoint_at: float | None = None
    save_s: float = 0.0
    restore_s: float = 0.0
    #: a replica is on a drained node: the job is asked to stop (reason `drain`)
    drained: bool = False
    #: decisions about this job (placements, nominations, stops that make room) the fold
    #: refused that were made on the count before (`ClusterState.apply`); the policy puts it
    #: in the next one's id, which the stream would otherwise drop as the refused one's
    refusals: int = 0

    @property
    def elastic(self) -> bool:
        return self.min_replicas < self.replicas

    @property
    def active_replicas(self) -> int:
        """Replicas that hold GPUs and are not being stopped."""
        return len(self.held) - self.stop_replicas

    def gpus_held(self) -> int:
        return len(self.held) * self.gpus


def gpus_in(replicas: list[Replica] | tuple[Replica, ...]) -> int:
    return sum(len(r.gpus) for r in replicas)
