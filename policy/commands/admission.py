"""Admission: is a submitted job one the cluster could ever run? (rule 10, docs/rules.md)

Refused with a reason that names the bad value: an unknown project, pool, node or class; a
job its pools could not hold even when empty; a job larger than its project's limit. An
admitted job carries its resolved priority, preemptibility and the pools it could run in.
"""

from __future__ import annotations

from typing import Final

from events import JobAdmitted, JobRejected, JobSpec, JobSubmitted, ids
from policy.commands.names import name_problem
from policy.cycle import could_hold
from policy.state import ClusterState

ACTOR: Final = "admission"
MAX_PORT: Final = 65535


class Refused(Exception):
    """A submission that cannot be admitted; the message names the bad value."""


def validate_spec(job_id: str, spec: JobSpec) -> None:
    """Checks that need no cluster state."""
    problem = name_problem("job id", job_id)
    if problem is not None:
        raise Refused(problem)
    if spec.gpus < 0:
        raise Refused(f"gpus must be 0 or more, got {spec.gpus}")
    if spec.replicas < 1:
        raise Refused(f"replicas must be 1 or more, got {spec.replicas}")
    if spec.min_replicas is not None and not 1 <= spec.min_replicas <= spec.replicas:
        raise Refused(
            f"min_replicas must be between 1 and replicas ({spec.replicas}), "
            f"got {spec.min_replicas}"
        )
    if spec.preemption_delay_s < 0:
        raise Refused(f"preemption_delay must not be negative, got {spec.preemption_delay_s}s")
    if spec.min_runtime_s < 0:
        raise Refused(f"min_runtime must not be negative, got {spec.min_runtime_s}s")
    _check_ports(spec)


def _check_ports(spec: JobSpec) -> None:
    """Ports in range, and no host port twice (a node publishes it once). A port no node
    could ever offer is not refused here: whether one is free is the policy's to see."""
    hosts: set[int] = set()
    for p in spec.ports:
        for port in (p.host, p.container):
            if not 1 <= port <= MAX_PORT:
                raise Refused(
                    f"port {p.host}:{p.container}: {port} is not between 1 and {MAX_PORT}"
                )
        if p.host in hosts:
            raise Refused(f"port {p.host}:{p.container}: host port {p.host} is given twice")
        hosts.add(p.host)


def admit(
    state: ClusterState, submitted: JobSubmitted, now: float, after: int = 0
) -> JobAdmitted | JobRejected:
    """Decide on a submission. Pure: the event it returns is the whole decision. `after`: see
    `ids.submitted`."""
    base = {
        "id": ids.admission(submitted.job_id, after),
        "time": now,
        "actor": ACTOR,
        "causation": submitted.id,
        "job_id": submitted.job_id,
    }
    try:
        return JobAdmitted(**base, **_resolve(state, submitted.job_id, submitted.spec))  # type: ignore[arg-type]
    except Refused as refused:
        return JobRejected(**base, reason=str(refused))  # type: ignore[arg-type]


def _resolve(state: ClusterState, job_id: str, spec: JobSpec) -> dict[str, object]:
    validate_spec(job_id, spec)
    project = state.projects.get(spec.project)
    if project is None:
        known = ", ".join(sorted(state.projects)) or "none"
        raise Refused(f"unknown project {spec.project!r} (known: {known})")
    priority, preemptible = _priority(state, spec)
    pools = _pools(state, spec)
    min_replicas = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    feasible = [p for p in pools if could_hold(state, p, spec.gpus, min_replicas, spec.node)]
    if not feasible:
        raise Refused(_never_fits(state, pools, spec.gpus, min_replicas, spec.node))
    within_limit = [
        p for p in feasible if _within_limit(state, spec.project, p, spec.gpus * min_replicas)
    ]
    if not within_limit:
        pool = feasible[0]
        limit = project.in_pool(pool).limit
        raise Refused(
            f"job needs {spec.gpus * min_replicas} GPUs, more than project {spec.project!r}'s "
            f"limit of {limit} in pool {pool!r}"
        )
    return {
        "project": spec.project,
        "priority": priority,
        "preemptible": preemptible,
        "gpus": spec.gpus,
        "replicas": spec.replicas,
        "min_replicas": min_replicas,
        "pools": tuple(within_limit),
        "node": spec.node,
        "preemption_delay_s": spec.preemption_delay_s,
        "min_runtime_s": spec.min_runtime_s,
    }


def _priority(state: ClusterState, spec: JobSpec) -> tuple[int, bool]:
    """The job's priority and preemptibility: given, or from its class (by default `train`,
    or the first class there is); a job given only a priority is preemptible."""
    if spec.priority_class is None and spec.priority is not None:
        return spec.priority, True if spec.preemptible is None else spec.preemptible
    if spec.priority_class is not None:
        cls = state.priority_class(spec.priority_class)
        if cls is None:
            known = ", ".join(c.name for c in state.settings.priority_classes)
            raise Refused(f"unknown priority class {spec.priority_class!r} (known: {known})")
    else:
        cls = state.priority_class("train") or state.settings.priority_classes[0]
    priority = cls.priority if spec.priority is None else spec.priority
    return priority, cls.preemptible if spec.preemptible is None else spec.preemptible


def _pools(state: ClusterState, spec: JobSpec) -> tuple[str, ...]:
    """The pools the job names, or its node's pool, or the default pool for its kind."""
    if spec.node is not None and spec.node not in state.nodes:
        raise Refused(f"unknown node {spec.node!r}")
    pools = spec.pools
    if not pools and spec.node is not None:
        pools = (state.nodes[spec.node].pool,)
    elif not pools:
        default = state.compute_pool() if spec.gpus > 0 else state.aux_pool()
        if default is None:
            raise Refused("the cluster has no pool yet")
        pools = (default,)
    for pool in pools:
        if pool not in state.pools:
            known = ", ".join(state.pools) or "none"
            raise Refused(f"unknown pool {pool!r} (known: {known})")
    if spec.node is not None and state.nodes[spec.node].pool not in pools:
        raise Refused(f"node {spec.node!r} is not in pool {' or '.join(map(repr, pools))}")
    return pools


def _within_limit(state: ClusterState, project: str, pool: str, gpus: int) -> bool:
    if state.pool_settings(pool).type == "priority":
        return True  # limits play no part in a priority pool, admission included
    limit = state.projects[project].in_pool(pool).limit
    return limit is None or gpus <= limit


def _never_fits(
    state: ClusterState, pools: tuple[str, ...], gpus: int, replicas: int, node: str | None
) -> str:
    reasons = []
    for pool in pools:
        nodes = [n for n in state.nodes.values() if n.pool == pool]
        if node is not None:
            nodes = [n for n in nodes if n.name == node]
        where = f"node {node!r}" if node is not None else f"pool {pool!r}"
        if not nodes:
            reasons.append(f"{where} has no nodes")
            continue
        largest = max(n.gpus for n in nodes)
        if gpus > largest:
            reasons.append(
                f"a replica needs {gpus} GPUs but the largest node in {where} has {largest}"
            )
        else:
            slots = sum(n.gpus // gpus for n in nodes) if gpus else 0
            reasons.append(
                f"{replicas} replicas of {gpus} GPUs need {replicas} slots "
                f"but {where} has {slots} even when empty"
            )
    return "the job can never fit: " + "; ".join(reasons)
