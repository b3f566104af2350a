"""Round robin: jobs take turns one replica at a time, the project holding the fewest GPUs first.

A gang's minimum is one turn (it is placed whole or not at all); an elastic job's extra replicas
take one turn each. Quotas play no part, limits still cap a project. It never preempts.
"""

from __future__ import annotations

import heapq

from policy.candidates import Candidate, JobKey, gate
from policy.pool_cycle import PoolCycle
from policy.turns import fewest_held_key, job_key


def allocate(cycle: PoolCycle, cands: list[Candidate]) -> list[Candidate]:
    queues: dict[str, list[tuple[JobKey, int, Candidate]]] = {}
    tie = 0
    maybe, waiting = cycle.split_by_room(cands)
    for cand in maybe:
        tie += 1
        heapq.heappush(queues.setdefault(cand.job.project, []), (job_key(cand), tie, cand))
    turns: list[tuple[int, int, str]] = []

    def rank(project: str) -> None:
        if queues.get(project):
            heapq.heappush(turns, (*fewest_held_key(cycle.accounts.account(project)), project))

    for project in queues:
        rank(project)
    while turns:
        _, _, project = heapq.heappop(turns)
        _, _, cand = heapq.heappop(queues[project])
        closed = gate(cycle.accounts.account(project), cand, respect_quota=False)
        if closed is None and cycle.try_place(cand):
            follow = cand.follow_up()
            if follow is not None:
                tie += 1
                heapq.heappush(queues[project], (job_key(follow), tie, follow))
        else:
            cycle.waiting[cand.job.id] = closed or "no_fit"
            waiting.append(cand)
        rank(project)
    return waiting


def preempt(cycle: PoolCycle, waiting: list[Candidate]) -> None:
    """Round robin never preempts."""
