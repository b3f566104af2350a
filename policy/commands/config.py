"""Configuration commands: projects, pools, cluster settings, scheduling holds and nodes taken
out of service.

A change names only what changes; the event it becomes names the complete result, so a replay
needs no history.
"""

from __future__ import annotations

import msgspec

from events import (
    ClusterConfigured,
    ClusterSettings,
    NodeCordoned,
    NodeUncordoned,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    SchedulerSettings,
    SchedulingHeld,
    ids,
)
from events.commands import (
    ConfigureCluster,
    CordonNode,
    HoldScheduling,
    SetPool,
    SetProject,
    UncordonNode,
)
from policy.commands.names import name_problem
from policy.commands.outcome import Accepted, Outcome, Refused, refuse
from policy.decay import settings_refusal
from policy.state import ClusterState


def hold(state: ClusterState, command: HoldScheduling, now: float, at: int) -> Outcome:
    event = SchedulingHeld(
        id=ids.scheduling_held(command.held, at),
        time=now,
        actor=command.actor,
        held=command.held,
        reason=command.reason,
    )
    return Accepted((event,))


def configure_cluster(
    state: ClusterState, command: ConfigureCluster, now: float, at: int
) -> Outcome:
    for field in ("default_compute_pool", "default_aux_pool"):
        name = getattr(command, field)
        problem = name_problem("pool name", field, name) if name else None
        if problem is not None:
            return problem
    problem = scheduler_problem(command.scheduler)
    if problem is not None:
        return problem
    # the command's fields are the settings' own: said once, in the structs
    fields = msgspec.structs.asdict(command)
    del fields["actor"]
    if not command.priority_classes:
        del fields["priority_classes"]  # none given: the defaults
    event = ClusterConfigured(
        id=ids.cluster_configured(at),
        time=now,
        actor=command.actor,
        settings=ClusterSettings(**fields),
    )
    return Accepted((event,))


def set_pool(state: ClusterState, command: SetPool, now: float, at: int) -> Outcome:
    problem = name_problem("pool name", "pool", command.pool) or scheduler_problem(
        command.scheduler
    )
    if problem is not None:
        return problem
    event = PoolConfigured(
        id=ids.pool_configured(command.pool, at),
        time=now,
        actor=command.actor,
        pool=command.pool,
        scheduler=command.scheduler,
    )
    return Accepted((event,))


def set_project(state: ClusterState, command: SetProject, now: float, at: int) -> Outcome:
    problem = name_problem("project name", "project", command.project)
    if problem is not None:
        return problem
    pool = command.pool or state.compute_pool()
    if pool is None or pool not in state.pools:
        known = ", ".join(state.pools) or "none"
        return refuse("unknown_pool", "pool", command.pool or "default", known=known)
    for field in ("quota", "over_quota_weight", "limit"):
        value = getattr(command, field)
        if value is not None and value < 0:
            return refuse("out_of_range", field, value, what=field, bound="be 0 or more")
    project = state.projects.get(command.project)
    terms = dict(project.terms) if project is not None else {}
    terms[pool] = merged_terms(terms.get(pool, ProjectTerms()), command)
    event = ProjectConfigured(
        id=ids.project_configured(command.project, at),
        time=now,
        actor=command.actor,
        project=command.project,
        terms=terms,
    )
    return Accepted((event,))


def merged_terms(old: ProjectTerms, command: SetProject) -> ProjectTerms:
    """The terms after the change: what the command leaves out keeps its value."""
    limit = None if command.no_limit else (old.limit if command.limit is None else command.limit)
    return ProjectTerms(
        quota=old.quota if command.quota is None else command.quota,
        over_quota_weight=(
            old.over_quota_weight
            if command.over_quota_weight is None
            else command.over_quota_weight
        ),
        limit=limit,
        priority=old.priority if command.priority is None else command.priority,
    )


def cordon_node(state: ClusterState, command: CordonNode, now: float, at: int) -> Outcome:
    """Cordon (or drain) a registered node; cordoning one that is cordoned already, or
    draining it, is accepted: an operator may say it again, or decide to drain after all."""
    refusal = _unknown_node(state, command.node)
    if refusal is not None:
        return refusal
    event = NodeCordoned(
        id=ids.node_cordoned(command.node, at),
        time=now,
        actor=command.actor,
        node=command.node,
        drain=command.drain,
        reason=command.reason,
    )
    return Accepted((event,))


def uncordon_node(state: ClusterState, command: UncordonNode, now: float, at: int) -> Outcome:
    refusal = _unknown_node(state, command.node)
    if refusal is not None:
        return refusal
    event = NodeUncordoned(
        id=ids.node_uncordoned(command.node, at),
        time=now,
        actor=command.actor,
        node=command.node,
        reason=command.reason,
    )
    return Accepted((event,))


def _unknown_node(state: ClusterState, node: str) -> Refused | None:
    if node in state.nodes:
        return None
    known = ", ".join(sorted(state.nodes)) or "none"
    return refuse("unknown_node", "node", node, known=known)


def scheduler_problem(settings: SchedulerSettings | None) -> Refused | None:
    """Rule 11's bounds on a pool's (or the cluster's) scheduler settings, naming the value."""
    found = (
        None if settings is None else settings_refusal(settings.usage_half_life_s, settings.usage_k)
    )
    return None if found is None else Refused("out_of_range", found[0], found[1])
