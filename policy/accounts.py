"""Per-pool project accounting for one cycle: usage, demand, quota and fair share.

Usage counts what a project holds and keeps: replicas being stopped no longer count (their GPUs
are on their way back), GPUs held by a nomination do (they are as good as the nominee's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from events.model import UsageFacts
from policy.decay import U_DIGITS
from policy.division import Claim, History, divide
from policy.state import ClusterState, Job

UNLIMITED = 1 << 40
V = TypeVar("V")


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


class Accounts:
    """Every project's account in one pool, for one cycle (the quota ledger service keeps
    usage across the log; this is the cycle's own book)."""

    def __init__(
        self, state: ClusterState, pool: str, capacity: int, now: float | None = None
    ) -> None:
        self.pool = pool
        #: Rule 11: the decayed usage the division weighs (a fair-share pool with a half-life,
        #: evaluated at `now`), and what it did to the shares when it changed any of them
        self.history: History | None = None
        self.half_life_s = 0.0
        #: every project's, when the history moved any share (None: it moved none)
        self.usage_facts: UsageFacts | None = None
        self._facts_of: dict[frozenset[str], UsageFacts] = {}
        usage = state.usage.get(pool) if now is not None else None
        settings = state.pool_settings(pool)
        if usage is not None and now is not None and settings.type == "fair_share":
            self.history = History(usage.shares(max(now, state.last_time)), settings.usage_k)
            self.half_life_s = usage.half_life_s
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
        if self.history is not None:
            self._divide_with_history(claims, self.history)
            return
        for name, share in divide(self.capacity, claims).items():
            self.accounts[name].fair_share = share

    def _divide_with_history(self, claims: list[Claim], history: History) -> None:
        """Rule 11's division; where it gives any project another share than the weights
        alone would, the facts of what it weighed are kept for the decisions to carry."""
        weights: dict[str, Fraction] = {}
        shares = divide(self.capacity, claims, history, weights)
        plain = divide(self.capacity, claims)
        for name, share in shares.items():
            self.accounts[name].fair_share = share
        if shares == plain:
            return
        shown = [a.project for a in self.accounts.values() if a.demand or a.usage or a.quota]
        self.usage_facts = UsageFacts(
            half_life_s=self.half_life_s,
            k=history.k,
            decayed_usage={p: history.usage.get(p, 0.0) for p in shown},
            share_weight={p: round(float(weights[p]), U_DIGITS) for p in shown if p in weights},
            fair_share={p: shares[p] for p in shown},
            without_history={p: plain[p] for p in shown},
        )

    def history_of(self, projects: Iterable[str]) -> UsageFacts | None:
        """Rule 11's facts for a decision involving these projects (its own, its victims'),
        when the history moved any share of the pool: only theirs, so that a decision in a
        pool of many projects does not carry all of them."""
        if self.usage_facts is None:
            return None
        key = frozenset(projects)
        found = self._facts_of.get(key)
        if found is None:
            f = self.usage_facts

            def only(values: dict[str, V]) -> dict[str, V]:
                return {p: v for p, v in values.items() if p in key}

            found = self._facts_of[key] = UsageFacts(
                half_life_s=f.half_life_s,
                k=f.k,
                decayed_usage=only(f.decayed_usage),
                share_weight=only(f.share_weight),
                fair_share=only(f.fair_share),
                without_history=only(f.without_history),
            )
        return found

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
