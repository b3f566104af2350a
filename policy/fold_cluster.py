"""The fold's handlers for the cluster's configuration and its nodes: settings, pools,
projects, the operator's hold and volume grants; nodes registered, lost, cordoned and
uncordoned (a lost node's replicas are given back with it)."""

from __future__ import annotations

from typing import Final

from events import (
    ClusterConfigured,
    Event,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PoolConfigured,
    ProjectConfigured,
    SchedulingHeld,
    VolumesConfigured,
)
from policy.cluster_data import ClusterData, Handler, Refusal
from policy.records import HOLDING_PHASES, Node, Project, gpus_in


def _cluster_configured(state: ClusterData, e: ClusterConfigured) -> Refusal:
    state.settings = e.settings
    for name in (e.settings.default_compute_pool, e.settings.default_aux_pool):
        if name is not None:
            state._ensure_pool(name)
    for name in state.pools:
        state._retune_usage(name)
    return None


def _scheduling_held(state: ClusterData, e: SchedulingHeld) -> Refusal:
    state.held = e.held
    return None


def _volumes_configured(state: ClusterData, e: VolumesConfigured) -> Refusal:
    state.volumes = e.grants
    return None


def _pool_configured(state: ClusterData, e: PoolConfigured) -> Refusal:
    state._ensure_pool(e.pool).scheduler = e.scheduler
    state._retune_usage(e.pool)
    return None


def _project_configured(state: ClusterData, e: ProjectConfigured) -> Refusal:
    project = state.projects.get(e.project)
    if project is None:
        project = state.projects[e.project] = Project(name=e.project, order=len(state.projects))
    project.terms = dict(e.terms)
    return None


def _node_registered(state: ClusterData, e: NodeRegistered) -> Refusal:
    state._ensure_pool(e.pool)
    known = state.nodes.get(e.node)
    if known is not None:
        state._count_capacity(known.pool, -known.gpus)
        state._count_capacity(e.pool, e.gpus)
        known.pool, known.gpus = e.pool, e.gpus
        return None
    state._count_capacity(e.pool, e.gpus)
    state.nodes[e.node] = Node(name=e.node, pool=e.pool, gpus=e.gpus, order=state._node_seq)
    state._node_seq += 1
    return None


def _node_lost(state: ClusterData, e: NodeLost) -> Refusal:
    lost = state.nodes.pop(e.node, None)
    if lost is None:
        return "unknown node"
    state._count_capacity(lost.pool, -lost.gpus)
    state.owners.pop(e.node, None)
    state.reserved.pop(e.node, None)
    for job in list(state.live.values()):
        if job.nomination and any(r.node == e.node for r in job.nomination):
            state._drop_nomination(job)
        if not any(r.node == e.node for r in job.held):
            continue
        kept = [r for r in job.held if r.node != e.node]
        state._count_held(job, -gpus_in([r for r in job.held if r.node == e.node]))
        job.stop_replicas = min(job.stop_replicas, len(kept))
        job.held = kept
        if not kept:
            state._end_attempt(job, e.time)
        elif job.phase in HOLDING_PHASES:
            job.lost_node = True
    return None


def _node_cordoned(state: ClusterData, e: NodeCordoned) -> Refusal:
    """No new work on the node: nominations holding its GPUs are dropped (their jobs wait to
    be placed again, elsewhere), and placements decided before the cordon are refused. A drain
    also marks the jobs running there, which the next cycle asks to stop."""
    node = state.nodes.get(e.node)
    if node is None:
        return "unknown node"
    node.cordoned = True
    for job in list(state.live.values()):
        if job.nomination and any(r.node == e.node for r in job.nomination):
            state._drop_nomination(job)
        if e.drain and job.phase in HOLDING_PHASES and any(r.node == e.node for r in job.held):
            job.drained = True
    return None


def _node_uncordoned(state: ClusterData, e: NodeUncordoned) -> Refusal:
    node = state.nodes.get(e.node)
    if node is None:
        return "unknown node"
    node.cordoned = False
    return None


HANDLERS: Final[dict[type[Event], Handler]] = {
    ClusterConfigured: _cluster_configured,
    PoolConfigured: _pool_configured,
    SchedulingHeld: _scheduling_held,
    VolumesConfigured: _volumes_configured,
    NodeRegistered: _node_registered,
    NodeLost: _node_lost,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    ProjectConfigured: _project_configured,
}
