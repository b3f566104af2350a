"""The candidate search: each pool's candidates for a cycle, and what every project holds.

Pending jobs are routed to the pools they may run in (their demand counted in the first that
could hold them, a candidate in each, in list order), running jobs are counted as holding
their GPUs (an elastic one short of its replicas asks for more), and nominees whose held GPUs
are free start on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from policy.accounts import Account, Accounts
from policy.candidates import Candidate, WaitReason
from policy.pool_cycle import PoolCycle
from policy.pools import could_hold
from policy.state import ClusterState, Job

_HELD_FOR_IT: Final = "on the GPUs held for it"


def gather(
    state: ClusterState,
    cycles: dict[str, PoolCycle],
    waiting: dict[str, WaitReason],
) -> Queued:
    """Count usage and demand per pool, start nominees whose GPUs are free, and gather the
    candidates."""
    queued = Queued([{}], set())
    rounds = queued.rounds
    # per job shape: the account of each project in the accounts its demand counts in, and the
    # candidate lists it joins (None: no pool could hold it)
    routes: dict[tuple[tuple[str, ...], int, int, str | None], _Route | None] = {}
    ported = state.ported()  # mostly empty: most jobs' `spec` is never read
    for job in state.live.values():
        phase = job.phase
        if phase == "pending" and not job.nomination:
            key = (job.pools, job.gpus, job.min_replicas, job.node)
            route = routes.get(key, _UNSEEN)
            if route is _UNSEEN:
                found = _route(state, job, cycles, rounds)
                route = routes[key] = None if found is None else (found[0], {}, found[1])
            if route is None:
                waiting[job.id] = "no_pool"
                continue
            book, known, targets = route
            acct = known.get(job.project)
            if acct is None:
                acct = known[job.project] = book.account(job.project)
            acct.demand += job.replicas * job.gpus  # accounts.count_waiting(job)
            ports = job.spec.host_ports() if ported and id(job) in ported else ()
            cand = Candidate(job, job.min_replicas, ports=ports)
            for target in targets:
                target.append(cand)
        elif phase in _PLACED:
            cycle = cycles.get(job.pool or "")
            if cycle is not None:
                _account_placed(cycle, job, queued)
        elif phase == "stopping":
            cycle = cycles.get(job.pool or "")
            if cycle is not None:
                cycle.accounts.count_waiting(job)
        elif phase == "pending":  # nominated
            cycle = cycles.get(job.nomination_pool or "")
            if cycle is not None:
                _account_nominated(cycle, job, queued, waiting)
    return queued


@dataclass(slots=True)
class Queued:
    """A cycle's candidates: rounds[k][pool] holds the jobs for which `pool` is the k-th pool
    to try; `extras` the jobs asking for extra replicas, which hold GPUs or are given them
    in this cycle (they never count as waiting)."""

    rounds: list[dict[str, list[Candidate]]]
    extras: set[str]

    def extra(self, pool: str, job: Job, before: int) -> None:
        self.rounds[0].setdefault(pool, []).append(Candidate(job, 1, extra=True, before=before))
        self.extras.add(job.id)


def _account_placed(cycle: PoolCycle, job: Job, queued: Queued) -> None:
    """A starting or running job: it holds GPUs, may start replicas held for it, and an elastic
    one short of its replicas asks for more."""
    cycle.accounts.count_holding(job)
    cycle.victims.running.append(job)
    if job.nomination:
        cycle.accounts.count_nominated(job)
        if _start_if_free(cycle, job, scale_up=True):
            _queue_extra(cycle, queued, job, len(job.held) + len(job.nomination))
    elif job.elastic and not job.stop_replicas and not job.lost_node:
        if job.active_replicas < job.replicas:
            queued.extra(cycle.pool, job, job.active_replicas)


def _account_nominated(
    cycle: PoolCycle,
    job: Job,
    queued: Queued,
    waiting: dict[str, WaitReason],
) -> None:
    """A pending job with GPUs held for it: it starts once they are free, else waits."""
    cycle.accounts.count_waiting(job)
    cycle.accounts.count_nominated(job)
    if _start_if_free(cycle, job, scale_up=False):
        _queue_extra(cycle, queued, job, len(job.nomination))
    else:
        waiting[job.id] = "nominated"


def _queue_extra(cycle: PoolCycle, queued: Queued, job: Job, holds: int) -> None:
    """A job that starts on GPUs held for it takes part in this cycle's turns for its extra
    replicas (rule 6)."""
    if job.elastic and holds < job.replicas:
        queued.extra(cycle.pool, job, holds)


_Route = tuple[Accounts, dict[str, Account], list[list[Candidate]]]
_UNSEEN: Final[Any] = object()
_NONE: Final[dict[int, str]] = {}
_PLACED: Final = frozenset({"starting", "running"})


def _route(
    state: ClusterState,
    job: Job,
    cycles: dict[str, PoolCycle],
    rounds: list[dict[str, list[Candidate]]],
) -> tuple[Accounts, list[list[Candidate]]] | None:
    """Where a pending job of this shape counts and is tried: its demand in the first pool of
    its list that could hold it, and a candidate in each such pool, in list order (round k)."""
    pools = [
        p
        for p in job.pools
        if p in cycles and could_hold(state, p, job.gpus, job.min_replicas, job.node)
    ]
    if not pools:
        return None
    targets = []
    for k, pool in enumerate(pools):
        while len(rounds) <= k:
            rounds.append({})
        targets.append(rounds[k].setdefault(pool, []))
    return cycles[pools[0]].accounts, targets


def _start_if_free(cycle: PoolCycle, job: Job, scale_up: bool) -> bool:
    owners = cycle.state.owners
    if any(g in owners.get(r.node, _NONE) for r in job.nomination for g in r.gpus):
        return False  # a victim has not let go yet
    if any(r.node not in cycle.capacity.by_name for r in job.nomination):
        return False
    holds = len(job.held) + len(job.nomination) if scale_up else None
    cycle.decisions.place(job, cycle.pool, job.nomination, holds=holds, note=_HELD_FOR_IT)
    return True
