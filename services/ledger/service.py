"""The quota ledger service.

Configuration commands become `ProjectConfigured` / `PoolConfigured` events carrying the
complete result (a change names only what changes; the event names everything, so replay
needs no history). From the log it keeps each project's usage per pool and records
`ProjectQuotaCrossed` when a project goes over its quota or back within it. What it recorded
before is read back from the log, so a restarted ledger does not announce old crossings again.
"""

from __future__ import annotations

import re
import time
from typing import Final

from events import (
    ClusterConfigured,
    NodeLost,
    PoolConfigured,
    ProjectConfigured,
    ProjectQuotaCrossed,
    ProjectTerms,
    SchedulingHeld,
)
from events.commands import (
    LEDGER_SUBJECT,
    AnyCommand,
    ConfigureCluster,
    HoldScheduling,
    Reply,
    SetPool,
    SetProject,
)
from policy.state import ClusterState, Job
from services.runtime.commands import Refusal, serve
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.snapshots import EVERY_EVENTS, SnapshotStore, Snapshotter

NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def counted_usage(job: Job) -> tuple[str, str, int] | None:
    """What a job adds to its project's usage: (project, pool, GPUs), or None if nothing."""
    if job.pool is None or job.phase not in ("starting", "running"):
        return None
    return job.project, job.pool, job.active_replicas * job.gpus


class Usage:
    """Each project's GPUs in use per pool, kept by delta: an event about one job changes only
    that job's part (a scan of every live job on every event cost the ledger a fifth of its
    time at 600 jobs/s). Events about many jobs at once (a lost node) count again."""

    def __init__(self) -> None:
        self.by_pool: dict[tuple[str, str], int] = {}
        self.parts: dict[str, tuple[str, str, int]] = {}

    def job_changed(self, job: Job) -> None:
        old, new = self.parts.pop(job.id, None), counted_usage(job)
        if old == new:
            if new is not None:
                self.parts[job.id] = new
            return
        if old is not None:
            self.by_pool[old[:2]] -= old[2]
        if new is not None:
            self.parts[job.id] = new
            self.by_pool[new[:2]] = self.by_pool.get(new[:2], 0) + new[2]

    def recount(self, state: ClusterState) -> None:
        self.by_pool.clear()
        self.parts.clear()
        for job in state.live.values():
            self.job_changed(job)

    def of(self, project: str, pool: str) -> int:
        return self.by_pool.get((project, pool), 0)


class Ledger:
    def __init__(self, log: EventLog, snapshot_every: int = EVERY_EVENTS) -> None:
        self.log = log
        # the ledger takes the snapshots every decision service restarts from (see snapshots.py)
        snapshotter = Snapshotter(SnapshotStore(log.js), every=snapshot_every)
        self.follower = Follower(log, snapshotter=snapshotter)
        self.over: dict[tuple[str, str], bool] = {}  # as last recorded in the log
        self.usage = Usage()
        self.live = False

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up(self._observe)
        self.live = True
        await serve(self.log.nc, LEDGER_SUBJECT, self.handle)
        await self.follower.run(self._observe)

    async def handle(self, command: AnyCommand) -> Reply:
        state = self.follower.state
        event: ProjectConfigured | PoolConfigured | ClusterConfigured | SchedulingHeld
        match command:
            case HoldScheduling(held=held, reason=reason):
                event = SchedulingHeld(
                    id=f"held/{held}/{self.follower.applied_seq}",
                    time=time.time(),
                    actor=command.actor,
                    held=held,
                    reason=reason,
                )
            case ConfigureCluster():
                for name in (command.default_compute_pool, command.default_aux_pool):
                    if name is not None and not NAME.match(name):
                        raise Refusal(f"pool name {name!r} is not valid")
                event = ClusterConfigured(
                    id=f"cluster/{self.follower.applied_seq}",
                    time=time.time(),
                    actor=command.actor,
                    scheduler=command.scheduler,
                    preemption_grace_s=command.preemption_grace_s,
                    priority_classes=command.priority_classes,
                    default_compute_pool=command.default_compute_pool,
                    default_aux_pool=command.default_aux_pool,
                )
            case SetProject():
                terms = self._merged_terms(state, command)
                event = ProjectConfigured(
                    id=f"project/{command.project}/{self.follower.applied_seq}",
                    time=time.time(),
                    actor=command.actor,
                    project=command.project,
                    terms=terms,
                )
            case SetPool(pool=pool, scheduler=scheduler):
                if not NAME.match(pool):
                    raise Refusal(f"pool name {pool!r} is not valid")
                event = PoolConfigured(
                    id=f"pool/{pool}/{self.follower.applied_seq}",
                    time=time.time(),
                    actor=command.actor,
                    pool=pool,
                    scheduler=scheduler,
                )
            case _:
                raise Refusal(f"the ledger does not take {type(command).__name__} commands")
        seq = await self.log.publish_durably(event, give_up_after=5.0)
        await self.follower.wait_for(seq)
        return Reply(ok=True, event=event)

    def _merged_terms(self, state: ClusterState, command: SetProject) -> dict[str, ProjectTerms]:
        if not NAME.match(command.project):
            raise Refusal(f"project name {command.project!r} is not valid")
        pool = command.pool or state.compute_pool()
        if pool is None or pool not in state.pools:
            known = ", ".join(state.pools) or "none"
            raise Refusal(f"unknown pool {command.pool or 'default'!r} (known: {known})")
        for field in ("quota", "over_quota_weight", "limit"):
            value = getattr(command, field)
            if value is not None and value < 0:
                raise Refusal(f"{field} must be 0 or more, got {value}")
        project = state.projects.get(command.project)
        terms = dict(project.terms) if project is not None else {}
        old = terms.get(pool, ProjectTerms())
        limit = (
            None
            if command.no_limit
            else (command.limit if command.limit is not None else old.limit)
        )
        terms[pool] = ProjectTerms(
            quota=old.quota if command.quota is None else command.quota,
            over_quota_weight=(
                old.over_quota_weight
                if command.over_quota_weight is None
                else command.over_quota_weight
            ),
            limit=limit,
            priority=old.priority if command.priority is None else command.priority,
        )
        return terms

    async def _observe(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, ProjectQuotaCrossed):
            self.over[(event.project, event.pool)] = event.over
            return
        state = self.follower.state
        job = state.jobs.get(getattr(event, "job_id", None) or "")
        if job is not None:
            self.usage.job_changed(job)
            projects = [job.project]
        elif isinstance(event, NodeLost):
            self.usage.recount(state)
            projects = list(state.projects)
        else:
            project = getattr(event, "project", None)
            projects = [project] if project else []
        if not self.live:
            return
        for project in projects:
            if project in state.projects:
                await self._check_quota(project, event.id, stored.seq)

    async def _check_quota(self, project: str, cause: str, seq: int) -> None:
        for pool, terms in self.follower.state.projects[project].terms.items():
            usage = self.usage.of(project, pool)
            now_over = usage > terms.quota
            if self.over.get((project, pool), False) != now_over:
                self.over[(project, pool)] = now_over
                await self.log.publish_durably(
                    ProjectQuotaCrossed(
                        id=f"quota/{project}/{pool}/{seq}",
                        time=time.time(),
                        actor="ledger",
                        causation=cause,
                        project=project,
                        pool=pool,
                        usage=usage,
                        quota=terms.quota,
                        over=now_over,
                    )
                )
