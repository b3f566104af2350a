"""Per-pool project accounting for one cycle: usage, demand, quota and fair share.

Usage counts what a project holds and keeps: replicas being stopped no longer count (their GPUs
are on their way back), GPUs held by a nomination do (they are as good as the nominee's).
"""

from __future__ import annotations

from dataclasses import dataclass

from policy.fair_share import Claim, divide
from policy.state import ClusterState, Job

UNLIMITED = 1 << 40


@dataclass(slots=True)
class Account:
    project: str
    order: int
    quota: int
    weight: int
    limit: int
    priority: int
    usage: int = 0
    np_usage: int = 0  # non-preemptible usage, which must stay within quota
    demand: int = 0
    fair_share: int = 0

    def share_in_use(self, extra: int = 0) -> float:
        """Held (plus `extra`) as a part of the fair share; a zero share in use ranks last."""
        held = self.usage + extra
        if self.fair_share > 0:
            return held / self.fair_share
        return float("inf") if held > 0 else 0.0

    def add(self, gpus: int, preemptible: bool) -> None:
        self.usage += gpus
        if not preemptible:
            self.np_usage += gpus

    def remove(self, gpus: int, preemptible: bool) -> None:
        self.add(-gpus, preemptible)


class Ledger:
    """Every project's account in one pool."""

    def __init__(self, state: ClusterState, pool: str, capacity: int) -> None:
        self.pool = pool
        self.accounts: dict[str, Account] = {}
        for project in state.projects.values():
            terms = project.in_pool(pool)
            self.accounts[project.name] = Account(
                project=project.name,
                order=project.order,
                quota=terms.quota,
                weight=terms.over_quota_weight,
                limit=UNLIMITED if terms.limit is None else terms.limit,
                priority=terms.priority,
            )
        self.capacity = capacity

    def account(self, project: str) -> Account:
        found = self.accounts.get(project)
        if found is None:  # a job of a project that was never configured: no quota, no limit
            found = self.accounts[project] = Account(project, 1 << 30, 0, 1, UNLIMITED, 100)
        return found

    def count_holding(self, job: Job) -> None:
        acct = self.accounts.get(job.project) or self.account(job.project)
        gpus = job.active_replicas * job.gpus
        acct.usage += gpus
        if not job.preemptible:
            acct.np_usage += gpus
        acct.demand += job.replicas * job.gpus

    def count_nominated(self, job: Job) -> None:
        acct = self.account(job.project)
        acct.add(len(job.nomination) * job.gpus, job.preemptible)

    def count_waiting(self, job: Job) -> None:
        self.account(job.project).demand += job.replicas * job.gpus

    def divide(self) -> None:
        claims = [
            Claim(a.project, a.order, a.quota, a.weight, a.priority, min(a.demand, a.limit))
            for a in self.accounts.values()
        ]
        for name, share in divide(self.capacity, claims).items():
            self.accounts[name].fair_share = share

    def facts(
        self, only: set[str] | None = None
    ) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Fair share, usage and quota of the projects with any of them (or demand), in
        project order; only those in `only` if it is given."""
        active = [
            a
            for a in self.accounts.values()
            if (only is None or a.project in only) and (a.demand or a.usage or a.quota)
        ]
        return (
            {a.project: a.fair_share for a in active},
            {a.project: a.usage for a in active},
            {a.project: a.quota for a in active},
        )
