"""`--engine core`: a scenario on the pure policy with simulated executors and a virtual clock."""

from __future__ import annotations

import copy
from dataclasses import replace

from events import (
    ClusterConfigured,
    JobPreemptionRequested,
    PoolConfigured,
    ProjectTerms,
)
from events.catalogue import MAKES_ROOM
from fairlane.scenario.observe import Observation, observe
from fairlane.scenario.spec import ProjectEntry, Scenario, Step
from fairlane.virtual_cluster import VirtualCluster

#: How long `stable` runs the system on, in virtual time, with no job finishing.
STABLE_HORIZON_S = 3600.0


def project_terms(
    entry: ProjectEntry, pools: list[str], compute_pool: str
) -> dict[str, ProjectTerms]:
    """A project's terms per pool. A bare quota or limit is for the default compute pool;
    a bare weight or priority applies in every pool."""

    def pick(values: dict[str | None, int] | None, pool: str, everywhere: bool) -> int | None:
        if values is None:
            return None
        if pool in values:
            return values[pool]
        if None in values and (everywhere or pool == compute_pool):
            return values[None]
        return None

    terms: dict[str, ProjectTerms] = {}
    for pool in pools:
        weight = pick(entry.over_quota_weight, pool, everywhere=True)
        priority = pick(entry.priority, pool, everywhere=True)
        terms[pool] = ProjectTerms(
            quota=pick(entry.quota, pool, everywhere=False) or 0,
            over_quota_weight=1 if weight is None else weight,
            limit=pick(entry.limit, pool, everywhere=False),
            priority=100 if priority is None else priority,
        )
    return terms


def merge(old: ProjectEntry, new: ProjectEntry) -> ProjectEntry:
    """set_project: fields not given keep their values."""
    changes = {k: getattr(new, k) for k in ("quota", "limit", "over_quota_weight", "priority")}
    return replace(old, **{k: v for k, v in changes.items() if v is not None})


class CoreEngine:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.vc = VirtualCluster()
        cfg = scenario.config
        self.pools = [p.name for p in scenario.pools]
        self.compute_pool = cfg.default_compute_pool or self.pools[0]
        self.projects: dict[str, ProjectEntry] = {}
        self.vc.configure(
            ClusterConfigured(
                id="cluster",
                time=0.0,
                actor="user",
                scheduler=cfg.scheduler,
                preemption_grace_s=cfg.preemption_grace_s,
                priority_classes=cfg.priority_classes,
                default_compute_pool=self.compute_pool,
                default_aux_pool=cfg.default_aux_pool or self.compute_pool,
            )
        )
        for pool in scenario.pools:
            self.vc.add_pool(
                pool.name,
                PoolConfigured(
                    id=f"pool-{pool.name}",
                    time=0.0,
                    actor="user",
                    pool=pool.name,
                    scheduler=pool.scheduler,
                ),
            )
            for node in pool.nodes:
                self.vc.add_node(node.name, pool.name, node.gpus)
        for project in scenario.projects:
            self._set_project(project)
        self.vc.settle()

    def _set_project(self, entry: ProjectEntry) -> None:
        old = self.projects.get(entry.name)
        merged = merge(old, entry) if old is not None else entry
        self.projects[entry.name] = merged
        self.vc.set_project(entry.name, project_terms(merged, self.pools, self.compute_pool))

    def step(self, step: Step) -> None:
        vc = self.vc
        match step.kind:
            case "submit":
                for job in step.value:
                    vc.submit(job.id, job.spec)
            case "complete" | "fail" | "cancel" | "pause" | "resume":
                act = getattr(vc, step.kind)  # the virtual cluster names its commands alike
                for job_id in step.value:
                    act(job_id)
            case "set_project":
                self._set_project(step.value)
            case "add_node":
                if step.value.pool not in self.pools:
                    self.pools.append(step.value.pool)
                vc.add_node(step.value.name, step.value.pool, step.value.gpus)
            case "remove_node":
                vc.remove_node(step.value)
            case "advance":
                vc.advance(step.value)
                return
        vc.settle()

    def observe(self) -> Observation:
        seen = observe(self.vc.state, self.vc.log, self.vc.now, self.compute_pool)
        seen.unsettled = self._unsettled
        return seen

    def _unsettled(self) -> str:
        """Run on a copy: more cycles, then an hour with no job finishing."""
        probe = copy.deepcopy(self.vc)
        probe.observer = None
        probe.work.clear()
        before = {j.id: list(j.held) for j in probe.state.live.values() if j.held}
        start = len(probe.log)
        probe.settle()
        probe.advance(STABLE_HORIZON_S)
        after = {j.id: list(j.held) for j in probe.state.live.values() if j.held}
        preempted = sorted(
            {
                e.job_id
                for e in probe.log[start:]
                if isinstance(e, JobPreemptionRequested) and e.reason in MAKES_ROOM
            }
        )
        changes = []
        if preempted:
            changes.append("preemption of " + ", ".join(preempted))
        moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if moved:
            changes.append("allocation change of " + ", ".join(moved))
        return "; ".join(changes)
