"""Determined's priority scheduler: one queue per pool, by priority then submission time.

Quotas and limits play no part. A pending job preempts preemptible jobs of strictly lower
priority anywhere in the pool, lowest priority first, then newest (or least lost work), only as
many as needed, all or nothing.
"""

from __future__ import annotations

from events import Replica
from policy.candidates import Candidate, Shape
from policy.pool_cycle import PoolCycle
from policy.turns import queue_key
from policy.victim_search import Pick, Taken, take_until_fits
from policy.victims import Unit


def allocate(cycle: PoolCycle, cands: list[Candidate]) -> list[Candidate]:
    maybe, waiting = cycle.split_by_room(cands)
    queue = sorted(maybe, key=queue_key)
    no_fit: set[Shape] = set()
    i = 0
    while i < len(queue):
        cand = queue[i]
        i += 1
        if cand.shape() in no_fit or not cycle.try_place(cand):
            no_fit.add(cand.shape())
            cycle.waiting[cand.job.id] = "no_fit"
            waiting.append(cand)
            continue
        follow = cand.follow_up()
        if follow is not None:
            queue.insert(i, follow)
    return waiting


def preempt(cycle: PoolCycle, waiting: list[Candidate]) -> None:
    failed: dict[tuple[object, ...], int] = {}
    for cand in sorted(waiting, key=queue_key):
        job = cand.job
        memo = (job.priority, cand.shape(), cand.extra)
        if not cycle.delay_passed(cand):
            # waiting for GPUs being given back preempts nobody: the delay does not hold it
            cycle.waiting[job.id] = "preemption_delay"
            if cycle.may_ask(cand):
                cycle.try_releasing(cand)
            continue
        if not cycle.may_ask(cand) or failed.get(memo) == cycle.generation:
            continue
        if cycle.try_releasing(cand):
            continue
        pick = _lower_priority_picker(cycle, job.priority, job.node)
        taken = take_until_fits(cycle, cand, pick)
        if taken is None or not taken.units:
            failed[memo] = cycle.generation
            continue
        note = f"priority {job.priority} job preempts lower-priority work in pool {cycle.pool}"
        cycle.commit_preemption(cand, taken, "priority", note)


def _lower_priority_picker(cycle: PoolCycle, priority: int, pin: str | None) -> Pick:
    """Takes units of strictly lower priority, in the pool's taking order, that free GPUs the
    job could use (units of jobs already stopping or nominated are skipped)."""
    lineup = cycle.victims.pool_lineup()
    units, gone = lineup.units, cycle.victims.gone

    def pick(taken: Taken) -> tuple[Unit, list[Replica]] | None:
        i = lineup.live_from(taken.cursor.get("", 0))
        while i < len(units):
            unit = units[i]
            if unit.job.id not in gone:  # the lineup passes these: asked, it needs not be right
                freed = taken.replicas_freed(unit) if unit.job.priority < priority else []
                if freed and (pin is None or any(r.node == pin for r in freed)):
                    taken.cursor[""] = i
                    return unit, freed
            i = lineup.live_from(i + 1)
        taken.cursor[""] = i
        return None

    return pick
