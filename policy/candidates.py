"""A request for GPUs (`Candidate`), why one waits, and rule 3's gate on it.

A pending job's minimum gang is one candidate; each extra replica of an elastic job is one of
its own, taking its turn with other jobs (rule 6).
"""

from __future__ import annotations

from typing import Literal

from policy.accounts import Account
from policy.state import Job

#: Why a job is still waiting after a cycle (the API's "why is my job pending"):
#: no_fit: not enough idle GPUs of the right shape (and nobody it may preempt);
#: limit: its project's limit; quota: non-preemptible work only runs within quota;
#: preemption_delay: it may not preempt anyone yet; held: scheduling is held by an operator;
#: nominated: GPUs are held for it while others give them back; no_pool: no pool of its list
#: could hold it with its nodes as they are now.
WaitReason = Literal["no_fit", "limit", "quota", "preemption_delay", "held", "nominated", "no_pool"]
#: What placing a request looks at: GPUs per replica, replicas, the pinned node, host ports.
Shape = tuple[int, int, str | None, tuple[int, ...]]
#: A candidate's place among its project's candidates (`policy.turns.job_key`)
JobKey = tuple[int, int, int, int]


class Candidate:
    """A request for GPUs: a pending job's minimum gang, or one more replica of an elastic job.

    It keeps a copy of what the passes over every candidate read of its job (project,
    priority, submission order, preemptibility, size, node, preemption delay): made one after
    the other, candidates lie side by side in memory, while each job lies where it was made;
    at 40,000 candidates reading the jobs again in every pass missed the processor's cache.
    `ranked` is its job key once the turns have worked it out (`policy.turns.ranked`)."""

    __slots__ = (
        "before",
        "delay",
        "extra",
        "gpus",
        "job",
        "job_gpus",
        "node",
        "ports",
        "preemptible",
        "priority",
        "project",
        "ranked",
        "replicas",
        "seq",
    )

    def __init__(
        self,
        job: Job,
        replicas: int,
        extra: bool = False,
        before: int = 0,
        ports: tuple[int, ...] | None = None,
    ) -> None:
        self.job = job
        self.replicas = replicas
        self.extra = extra
        self.before = before  # replicas the job holds (or is given this cycle) before this
        self.project = job.project
        self.priority = job.priority
        self.seq = job.seq
        self.preemptible = job.preemptible
        self.job_gpus = job.gpus
        self.gpus = replicas * job.gpus
        self.node = job.node
        self.delay = job.preemption_delay_s
        if ports is None:  # not known to the caller: the job's own (no call for most jobs)
            spec = job.spec
            ports = spec.host_ports() if spec.ports else ()
        self.ports = ports
        self.ranked: JobKey | None = None

    def __repr__(self) -> str:
        return f"Candidate({self.job.id!r}, {self.replicas}, extra={self.extra})"

    def shape(self) -> Shape:
        return (self.job_gpus, self.replicas, self.node, self.ports)

    def follow_up(self) -> Candidate | None:
        """Once this is placed, an elastic job's next replica waits its turn (rule 6)."""
        after = self.before + self.replicas
        if self.job.elastic and after < self.job.replicas:
            return Candidate(self.job, 1, extra=True, before=after)
        return None


def gate(acct: Account, cand: Candidate, respect_quota: bool = True) -> WaitReason | None:
    """Rule 3: preemptible work may use idle GPUs up to the limit; non-preemptible work only
    while the project's non-preemptible usage stays within its quota. None: the gate is open."""
    if acct.usage + cand.gpus > acct.limit:
        return "limit"
    if respect_quota and not cand.job.preemptible and acct.np_usage + cand.gpus > acct.quota:
        return "quota"
    return None


def gate_ok(acct: Account, cand: Candidate, respect_quota: bool = True) -> bool:
    return gate(acct, cand, respect_quota) is None
