"""One scheduling cycle over the whole cluster: state and time in, decisions (events) out.

`decide(state, now)` is pure: it reads the state, never writes it, and uses no clock of its own,
so the scheduler service, the scenario runner and the simulator get the same decisions from the
same log. Order of work:

1. jobs that must stop (paused, cancelled, on a lost node) are asked to;
2. nominated jobs whose GPUs have been given up start on them;
3. per pool, fair shares are divided, then idle GPUs are handed out (the pool's scheduler);
   jobs with a list of pools try the next pool when one cannot take them;
4. per pool, jobs still waiting may preempt (in-project) or reclaim (between projects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from events import Event, JobPreemptionRequested, JobScheduled, Replica
from events.catalogue import PreemptionReason
from events.model import SchedulerType
from policy.capacity import Capacity, NodeSlots
from policy.ledger import Account, Ledger
from policy.pool_cycle import ACTOR, Candidate, PoolCycle
from policy.schedulers import fair_share, priority, round_robin
from policy.state import ClusterState, Job

Allocate = Callable[[PoolCycle, list[Candidate]], list[Candidate]]
Preempt = Callable[[PoolCycle, list[Candidate]], None]

SCHEDULERS: dict[SchedulerType, tuple[Allocate, Preempt]] = {
    "fair_share": (fair_share.allocate, fair_share.preempt),
    "priority": (priority.allocate, priority.preempt),
    "round_robin": (round_robin.allocate, round_robin.preempt),
}


def decide(state: ClusterState, now: float) -> list[Event]:
    out: list[Event] = []
    _ask_to_stop(state, now, out)
    if state.held:
        return out
    cycles, held = _pool_cycles(state, now, out)
    rounds = _account_and_collect(state, cycles, held, out)
    for cycle in cycles.values():
        cycle.ledger.divide()
    placed: set[str] = set()
    waiting_first: dict[str, list[Candidate]] = {}
    for k, by_pool in enumerate(rounds):
        for pool, cands in by_pool.items():
            todo = [c for c in cands if c.job.id not in placed] if placed else cands
            if not todo:
                continue
            allocate, _ = SCHEDULERS[cycles[pool].settings.type]
            start = len(out)
            waiting = allocate(cycles[pool], todo)
            # the jobs whose minimum was placed: an extra replica's placement is a scale-up
            placed.update(
                e.job_id for e in out[start:] if isinstance(e, JobScheduled) and not e.scale_up
            )
            if k == 0:
                waiting_first[pool] = waiting
    for pool, waiting in waiting_first.items():
        todo = [c for c in waiting if c.job.id not in placed] if placed else waiting
        if todo:
            _, preempt = SCHEDULERS[cycles[pool].settings.type]
            preempt(cycles[pool], todo)
    return out


def fair_shares(state: ClusterState, now: float) -> dict[str, dict[str, int]]:
    """Each pool's fair share per project, as the next cycle would compute it."""
    cycles, held = _pool_cycles(state, now, [])
    _account_and_collect(state, cycles, held, [])
    result: dict[str, dict[str, int]] = {}
    for pool, cycle in cycles.items():
        cycle.ledger.divide()
        result[pool] = {a.project: a.fair_share for a in cycle.ledger.accounts.values()}
    return result


def next_wakeup(state: ClusterState, now: float) -> float | None:
    """The next moment a decision could change with no new event: a pending job's
    preemption_delay or a running job's min_runtime runs out."""
    due: list[float] = []
    for job in state.live.values():
        if job.phase == "pending" and not job.nomination and job.preemption_delay_s > 0:
            due.append(job.pending_since + job.preemption_delay_s)
        elif job.phase == "running" and job.min_runtime_s > 0 and job.started_at is not None:
            due.append(job.started_at + job.min_runtime_s)
    later = [t for t in due if t > now]
    return min(later) if later else None


# -- the steps ---------------------------------------------------------------------------------


def _ask_to_stop(state: ClusterState, now: float, out: list[Event]) -> None:
    for job in state.live.values():
        if not job.held or job.stop_replicas:
            continue
        reason: PreemptionReason | None = None
        if job.phase in ("paused", "stopping"):
            reason = "pause"
        elif job.phase == "cancelled":
            reason = "cancel"
        elif job.lost_node:
            reason = "node_lost"
        if reason is not None:
            out.append(
                JobPreemptionRequested(
                    id=f"{job.id}/{job.attempt}/stop/{reason}",
                    time=now,
                    actor=ACTOR,
                    job_id=job.id,
                    attempt=job.attempt,
                    reason=reason,
                )
            )


def _pool_cycles(
    state: ClusterState, now: float, out: list[Event]
) -> tuple[dict[str, PoolCycle], dict[str, set[int]]]:
    held: dict[str, set[int]] = {}
    nominated: list[Replica] = []
    for job in state.live.values():
        if job.held:
            for r in job.held:
                gpus = held.get(r.node)
                if gpus is None:
                    held[r.node] = set(r.gpus)
                else:
                    gpus.update(r.gpus)
        if job.nomination:
            nominated.extend(job.nomination)
    taken = {node: set(gpus) for node, gpus in held.items()} if nominated else held
    for r in nominated:
        taken.setdefault(r.node, set()).update(r.gpus)
    by_pool: dict[str, list[NodeSlots]] = {p: [] for p in state.pools}
    none: set[int] = set()
    for node in state.nodes.values():
        busy = taken.get(node.name, none)
        slots = by_pool.setdefault(node.pool, [])
        free = [g for g in range(node.gpus) if g not in busy] if busy else list(range(node.gpus))
        slots.append(NodeSlots(node.name, node.order, len(slots), node.gpus, free))
    cycles: dict[str, PoolCycle] = {}
    for pool, nodes in by_pool.items():
        capacity = Capacity(nodes)
        ledger = Ledger(state, pool, capacity.total_gpus)
        settings = state.pool_settings(pool)
        cycles[pool] = PoolCycle(state, pool, settings, capacity, ledger, now, out)
    return cycles, held


def _account_and_collect(
    state: ClusterState,
    cycles: dict[str, PoolCycle],
    held: dict[str, set[int]],
    out: list[Event],
) -> list[dict[str, list[Candidate]]]:
    """Count usage and demand per pool, start nominees whose GPUs are free, and gather the
    candidates: rounds[k][pool] holds the jobs for which `pool` is the k-th pool to try."""
    rounds: list[dict[str, list[Candidate]]] = [{}]
    # per job shape: the account of each project in the ledger its demand counts in, and the
    # candidate lists it joins (None: no pool could hold it)
    routes: dict[tuple[tuple[str, ...], int, int, str | None], _Route | None] = {}
    for job in state.live.values():
        phase = job.phase
        if phase == "pending" and not job.nomination:
            key = (job.pools, job.gpus, job.min_replicas, job.node)
            route = routes.get(key, _UNSEEN)
            if route is _UNSEEN:
                found = _route(state, job, cycles, rounds)
                route = routes[key] = None if found is None else (found[0], {}, found[1])
            if route is None:
                continue
            ledger, accounts, targets = route
            acct = accounts.get(job.project)
            if acct is None:
                acct = accounts[job.project] = ledger.account(job.project)
            acct.demand += job.replicas * job.gpus  # ledger.count_waiting(job)
            cand = Candidate(job, job.min_replicas)
            for target in targets:
                target.append(cand)
        elif phase in _PLACED:
            cycle = cycles.get(job.pool or "")
            if cycle is None:
                continue
            cycle.ledger.count_holding(job)
            cycle.running.append(job)
            if job.nomination:
                cycle.ledger.count_nominated(job)
                _start_if_free(cycle, job, held, scale_up=True)
            elif job.elastic and not job.stop_replicas and not job.lost_node:
                if job.active_replicas < job.replicas:
                    rounds[0].setdefault(cycle.pool, []).append(
                        Candidate(job, 1, extra=True, before=job.active_replicas)
                    )
        elif phase == "stopping":
            cycle = cycles.get(job.pool or "")
            if cycle is not None:
                cycle.ledger.count_waiting(job)
        elif phase == "pending":  # nominated
            cycle = cycles.get(job.nomination_pool or "")
            if cycle is not None:
                cycle.ledger.count_waiting(job)
                cycle.ledger.count_nominated(job)
                _start_if_free(cycle, job, held, scale_up=False)
    return rounds


_Route = tuple[Ledger, dict[str, Account], list[list[Candidate]]]
_UNSEEN: Final[Any] = object()
_PLACED: Final = frozenset({"starting", "running"})


def _route(
    state: ClusterState,
    job: Job,
    cycles: dict[str, PoolCycle],
    rounds: list[dict[str, list[Candidate]]],
) -> tuple[Ledger, list[list[Candidate]]] | None:
    """Where a pending job of this shape counts and is tried: its demand in the first pool of
    its list that could hold it, and a candidate in each such pool, in list order (round k)."""
    pools = [p for p in job.pools if p in cycles and _could_hold(state, p, job)]
    if not pools:
        return None
    targets = []
    for k, pool in enumerate(pools):
        while len(rounds) <= k:
            rounds.append({})
        targets.append(rounds[k].setdefault(pool, []))
    return cycles[pools[0]].ledger, targets


def _start_if_free(cycle: PoolCycle, job: Job, held: dict[str, set[int]], scale_up: bool) -> None:
    if any(held.get(r.node, set()) & set(r.gpus) for r in job.nomination):
        return  # a victim has not let go yet
    if any(r.node not in cycle.capacity.by_name for r in job.nomination):
        return
    attempt = job.attempt if scale_up else job.attempt + 1
    count = len(job.held) + len(job.nomination)
    suffix = f"scale/{count}-{job.preemptions}" if scale_up else "scheduled"
    cycle.out.append(
        JobScheduled(
            id=f"{job.id}/{attempt}/{suffix}",
            time=cycle.now,
            actor=ACTOR,
            job_id=job.id,
            attempt=attempt,
            pool=cycle.pool,
            replicas=job.nomination,
            scale_up=scale_up,
            note="on the GPUs held for it",
        )
    )


def _could_hold(state: ClusterState, pool: str, job: Job) -> bool:
    """Could the pool hold the job's minimum if it were empty?"""
    return could_hold(state, pool, job.gpus, job.min_replicas, job.node)


def could_hold(state: ClusterState, pool: str, gpus: int, replicas: int, node: str | None) -> bool:
    nodes = [n for n in state.nodes.values() if n.pool == pool]
    if node is not None:
        nodes = [n for n in nodes if n.name == node]
    if not nodes:
        return False
    if gpus <= 0:
        return True
    return sum(n.gpus // gpus for n in nodes) >= replicas
