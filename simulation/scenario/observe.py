"""What an engine shows of the cluster, and checking a scenario's expectations against it.

Both engines (core and live) produce an `Observation`; `check` compares it with an
`Expectation` and returns one line per mismatch, saying what was expected and what was seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from events import Event, JobPreemptionRequested, JobRejected, Replica
from events.catalogue import MAKES_ROOM
from policy.cycle import fair_shares
from policy.state import ClusterState
from policy.usage import Usage
from simulation.spec import Expectation


@dataclass
class JobView:
    phase: str  # running, pending, paused, completed, failed, cancelled, rejected, ...
    replicas: int = 0
    min_replicas: int = 1
    nodes: tuple[str, ...] = ()
    preempted: int = 0
    reject_reason: str = ""
    events: tuple[str, ...] = ()


@dataclass
class Observation:
    jobs: dict[str, JobView] = field(default_factory=dict)
    compute_pool: str = "default"
    usage: dict[str, dict[str, int]] = field(default_factory=dict)  # project -> pool -> GPUs
    fair_share: dict[str, dict[str, int]] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)  # node or pool -> idle GPUs
    #: Runs the system on (on a copy) and says what changed; "" when nothing did.
    unsettled: Callable[[], str] = lambda: ""


def observe(
    state: ClusterState, log: Iterable[Event], now: float, compute_pool: str
) -> Observation:
    """What a scenario can see of a cluster: the folded state and the log it came from."""
    events: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    for event in log:
        job_id = getattr(event, "job_id", None)
        if job_id is not None:
            events.setdefault(job_id, []).append(type(event).__name__)
        if isinstance(event, JobRejected):
            reasons[event.job_id] = event.reason
    seen = Observation(compute_pool=compute_pool)
    for job in state.jobs.values():
        seen.jobs[job.id] = JobView(
            phase=job.phase,
            replicas=job.active_replicas if job.held else 0,
            min_replicas=job.min_replicas,
            nodes=tuple(r.node for r in job.held),
            preempted=job.preemptions,
            reject_reason=reasons.get(job.id, ""),
            events=tuple(events.get(job.id, ())),
        )
    seen.usage = Usage.of_state(state).per_project()
    for pool, shares in fair_shares(state, now).items():
        for project, share in shares.items():
            seen.fair_share.setdefault(project, {})[pool] = share
    busy: dict[str, int] = {}
    for job in state.live.values():
        for r in (*job.held, *job.nomination):
            busy[r.node] = busy.get(r.node, 0) + len(r.gpus)
    for node in state.nodes.values():
        idle = node.gpus - busy.get(node.name, 0)
        seen.free[node.name] = idle
        seen.free[node.pool] = seen.free.get(node.pool, 0) + idle
    for pool in state.pools:
        seen.free.setdefault(pool, 0)
    return seen


Holdings = dict[str, list[Replica]]


def holdings(state: ClusterState) -> Holdings:
    """Who holds which GPUs now."""
    return {j.id: list(j.held) for j in state.live.values() if j.held}


def what_changed(before: Holdings, after: Holdings, events: Iterable[Event]) -> str:
    """For `stable`: the preemptions among `events` and the jobs whose GPUs moved; ""."""
    preempted = sorted(
        {
            e.job_id
            for e in events
            if isinstance(e, JobPreemptionRequested) and e.reason in MAKES_ROOM
        }
    )
    moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    changes = []
    if preempted:
        changes.append("preemption of " + ", ".join(preempted))
    if moved:
        changes.append("allocation change of " + ", ".join(moved))
    return "; ".join(changes)


def check(expect: Expectation, seen: Observation) -> list[str]:
    """One line per expectation that does not hold: what was expected, what was seen."""
    problems = [
        *_phases(expect, seen),
        *_rejections(expect, seen),
        *_per_job(expect, seen),
        *_per_project(expect, seen),
        *_free(expect, seen),
    ]
    if expect.stable:
        change = seen.unsettled()
        if change:
            problems.append(f"stable: expected no change when run on, observed {change}")
    return problems


def _job(seen: Observation, job_id: str) -> JobView:
    return seen.jobs.get(job_id, JobView(phase="unknown"))


def _phases(expect: Expectation, seen: Observation) -> Iterator[str]:
    for state, ids in expect.lists.items():
        for job_id in ids:
            view = _job(seen, job_id)
            ok = view.phase == state
            if state == "running":
                ok = ok and view.replicas >= view.min_replicas
            elif state == "pending":
                ok = ok and view.replicas == 0
            if not ok:
                yield f"{state}: {job_id} expected {state}, observed {_describe(view)}"


def _rejections(expect: Expectation, seen: Observation) -> Iterator[str]:
    for job_id, text in (expect.rejected or {}).items():
        view = _job(seen, job_id)
        if view.phase != "rejected":
            yield f"rejected: {job_id} expected rejected, observed {_describe(view)}"
        elif text is not None and text not in view.reject_reason:
            yield (
                f"rejected: {job_id} expected a reason containing {text!r}, "
                f"observed {view.reject_reason!r}"
            )


def _per_job(expect: Expectation, seen: Observation) -> Iterator[str]:
    for job_id, n in (expect.preempted or {}).items():
        if _job(seen, job_id).preempted != n:
            yield f"preempted: {job_id} expected {n}, observed {_job(seen, job_id).preempted}"
    for job_id, n in (expect.replicas or {}).items():
        if _job(seen, job_id).replicas != n:
            yield f"replicas: {job_id} expected {n}, observed {_job(seen, job_id).replicas}"
    for job_id, nodes in (expect.placed_on or {}).items():
        observed = sorted(set(_job(seen, job_id).nodes))
        if observed != sorted(set(nodes)):
            yield f"placed_on: {job_id} expected {sorted(set(nodes))}, observed {observed}"
    for job_id, types in (expect.events or {}).items():
        observed_events = _job(seen, job_id).events
        if not _in_order(types, observed_events):
            yield (
                f"events: {job_id} expected {list(types)} in this order, "
                f"observed {list(observed_events)}"
            )


def _per_project(expect: Expectation, seen: Observation) -> Iterator[str]:
    for key, table, expected in (
        ("usage", seen.usage, expect.usage),
        ("fair_share", seen.fair_share, expect.fair_share),
    ):
        for project, per_pool in (expected or {}).items():
            for pool, n in per_pool.items():
                pool_name = pool or seen.compute_pool
                got = table.get(project, {}).get(pool_name, 0)
                if got != n:
                    yield f"{key}: {project} in pool {pool_name} expected {n}, observed {got}"


def _free(expect: Expectation, seen: Observation) -> Iterator[str]:
    for where, n in (expect.free or {}).items():
        if where not in seen.free:
            yield f"free: {where} is neither a node nor a pool"
        elif seen.free[where] != n:
            yield f"free: {where} expected {n}, observed {seen.free[where]}"


def _in_order(wanted: tuple[str, ...], seen: tuple[str, ...]) -> bool:
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)


def _describe(view: JobView) -> str:
    if view.phase == "running" and view.replicas < view.min_replicas:
        return f"running with {view.replicas} of minimum {view.min_replicas} replicas"
    if view.phase == "rejected":
        return f"rejected ({view.reject_reason})"
    return view.phase
