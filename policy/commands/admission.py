"""Admission: is a submitted job one the cluster could ever run? (rule 10, docs/rules.md)

Refused with a code, and words that name the bad value: an unknown project, pool, node or class; a
job its pools could not hold even when empty; a job larger than its project's limit; a volume
the cluster's allowlist does not cover (policy/commands/volumes.py). An
admitted job carries its resolved priority, preemptibility and the pools it could run in.
"""

from __future__ import annotations

from typing import Final

from events import JobAdmitted, JobRejected, JobSpec, JobSubmitted, ids
from policy.commands.names import name_problem
from policy.commands.outcome import Refused, refuse
from policy.commands.volumes import mount_problems
from policy.pools import could_hold, nodes_for
from policy.state import ClusterState

ACTOR: Final = "admission"
MAX_PORT: Final = 65535


class Inadmissible(Exception):
    """A submission that cannot be admitted, and why."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.reason)
        self.refused = refused


def _out_of_range(field: str, value: object, bound: str, what: str | None = None) -> Inadmissible:
    return Inadmissible(refuse("out_of_range", field, value, what=what or field, bound=bound))


def validate_spec(job_id: str, spec: JobSpec) -> None:
    """Checks that need no cluster state."""
    problem = name_problem("job id", "job_id", job_id)
    if problem is not None:
        raise Inadmissible(problem)
    if spec.gpus < 0:
        raise _out_of_range("gpus", spec.gpus, "be 0 or more")
    if spec.replicas < 1:
        raise _out_of_range("replicas", spec.replicas, "be 1 or more")
    if spec.min_replicas is not None and not 1 <= spec.min_replicas <= spec.replicas:
        bound = f"be between 1 and replicas ({spec.replicas})"
        raise _out_of_range("min_replicas", spec.min_replicas, bound)
    if spec.preemption_delay_s < 0:
        value = f"{spec.preemption_delay_s}s"
        raise _out_of_range("preemption_delay_s", value, "not be negative", "preemption_delay")
    if spec.min_runtime_s < 0:
        value = f"{spec.min_runtime_s}s"
        raise _out_of_range("min_runtime_s", value, "not be negative", "min_runtime")
    _check_ports(spec)


def _check_ports(spec: JobSpec) -> None:
    """Ports in range, and no host port twice (a node publishes it once). A port no node
    could ever offer is not refused here: whether one is free is the policy's to see."""
    hosts: set[int] = set()
    for p in spec.ports:
        for port in (p.host, p.container):
            if not 1 <= port <= MAX_PORT:
                problem = f"{port} is not between 1 and {MAX_PORT}"
                raise Inadmissible(
                    refuse("bad_port", "ports", f"{p.host}:{p.container}", problem=problem)
                )
        if p.host in hosts:
            problem = f"host port {p.host} is given twice"
            raise Inadmissible(
                refuse("bad_port", "ports", f"{p.host}:{p.container}", problem=problem)
            )
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
    except Inadmissible as no:
        refused = no.refused
        return JobRejected(**base, reason=refused.reason, code=refused.code, field=refused.field)  # type: ignore[arg-type]


def _resolve(state: ClusterState, job_id: str, spec: JobSpec) -> dict[str, object]:
    validate_spec(job_id, spec)
    project = state.projects.get(spec.project)
    if project is None:
        known = ", ".join(sorted(state.projects)) or "none"
        raise Inadmissible(refuse("unknown_project", "project", spec.project, known=known))
    problem = mount_problems(spec, state.volumes)
    if problem is not None:
        raise Inadmissible(refuse("bad_volume", "volumes", problem=problem))
    priority, preemptible = _priority(state, spec)
    pools = _pools(state, spec)
    min_replicas = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    feasible = [p for p in pools if could_hold(state, p, spec.gpus, min_replicas, spec.node)]
    if not feasible:
        why = _never_fits(state, pools, spec.gpus, min_replicas, spec.node)
        raise Inadmissible(refuse("never_fits", "gpus", why))
    within_limit = [
        p for p in feasible if _within_limit(state, spec.project, p, spec.gpus * min_replicas)
    ]
    if not within_limit:
        pool = feasible[0]
        limit = project.in_pool(pool).limit
        gpus = spec.gpus * min_replicas
        over = refuse("over_limit", "gpus", gpus, project=spec.project, limit=limit, pool=pool)
        raise Inadmissible(over)
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
    """The job's priority and preemptibility (`asked_priority`); an unknown class is refused."""
    found = asked_priority(state, spec)
    if found is None:
        known = ", ".join(c.name for c in state.settings.priority_classes)
        raise Inadmissible(refuse("unknown_class", "class", spec.priority_class, known=known))
    return found


def asked_priority(state: ClusterState, spec: JobSpec) -> tuple[int, bool] | None:
    """The priority and preemptibility a spec asks for: given, or from its class (by default
    `train`, or the first class there is); a job given only a priority is preemptible. None
    for a class the cluster does not have."""
    if spec.priority_class is None and spec.priority is not None:
        return spec.priority, True if spec.preemptible is None else spec.preemptible
    if spec.priority_class is not None:
        cls = state.priority_class(spec.priority_class)
        if cls is None:
            return None
    else:
        cls = state.priority_class("train") or state.settings.priority_classes[0]
    priority = cls.priority if spec.priority is None else spec.priority
    return priority, cls.preemptible if spec.preemptible is None else spec.preemptible


def _pools(state: ClusterState, spec: JobSpec) -> tuple[str, ...]:
    """The pools the job names, or its node's pool, or the default pool for its kind."""
    if spec.node is not None and spec.node not in state.nodes:
        known = ", ".join(sorted(state.nodes)) or "none"
        raise Inadmissible(refuse("unknown_node", "node", spec.node, known=known))
    pools = spec.pools
    if not pools and spec.node is not None:
        pools = (state.nodes[spec.node].pool,)
    elif not pools:
        default = state.compute_pool() if spec.gpus > 0 else state.aux_pool()
        if default is None:
            raise Inadmissible(refuse("no_pool", "pools"))
        pools = (default,)
    for pool in pools:
        if pool not in state.pools:
            known = ", ".join(state.pools) or "none"
            raise Inadmissible(refuse("unknown_pool", "pools", pool, known=known))
    if spec.node is not None and state.nodes[spec.node].pool not in pools:
        named = " or ".join(map(repr, pools))
        raise Inadmissible(refuse("not_in_pool", "node", spec.node, pools=named))
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
        nodes = nodes_for(state, pool, node)
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
    return "; ".join(reasons)
