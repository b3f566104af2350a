"""Rule 5, reclaim: a project within its fair share takes GPUs back from projects above theirs.

One victim at a time from the project that would be served last without it, only from projects
above their threshold, and only if no victim would come straight back and the claimant is the
first to be placed when the victims queue again beside it (anti ping-pong).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from events import Replica
from policy.accounts import Accounts
from policy.candidates import Candidate, gate_ok
from policy.pool_cycle import PoolCycle
from policy.schedulers.reclaim_order import (
    FirstTaken,
    could_fit,
    first_fit,
    first_taken,
    may_give,
    served_last_key,
    threshold,
)
from policy.turns import job_key, project_key
from policy.victim_search import Taken, fits_with, next_unit, take_until_fits
from policy.victims import Unit


def try_reclaim(cycle: PoolCycle, cand: Candidate) -> bool:  # noqa: PLR0911 (one return per rule)
    """Rule 5: take from preemptible jobs of other projects, only up to the claimant's fair
    share (and quota, for non-preemptible work), from projects above their threshold, one
    victim at a time from the project that would be served last without it."""
    job = cand.job
    claimant = cycle.accounts.account(job.project)
    after = claimant.usage + cand.gpus
    if after > claimant.fair_share:
        return False
    if not job.preemptible and claimant.np_usage + cand.gpus > claimant.quota:
        return False
    within_quota = after <= claimant.quota
    held = _givers(cycle, job.project, within_quota)
    # a quick bound first: most claimants it turns away never make the cycle build its reach
    if not held or not _could_free_enough(cycle, cand, held, within_quota):
        return False
    if job.node is not None:  # its walk skips victims that free nothing on its node
        taken = take_until_fits(cycle, cand, _ServedLast(cycle, held, within_quota, job.node))
    elif not could_fit(cycle, cand, within_quota):
        return False
    elif cand.ports or job.gpus <= 0:  # the slow path of ports
        taken = take_until_fits(cycle, cand, _ServedLast(cycle, held, within_quota, None))
    else:
        taken = first_fit(cycle, cand, list(held), within_quota)
    if taken is None or not taken.units:
        return False
    if not within_quota and _a_victim_comes_back(cycle, taken):
        return False
    if not _claimant_goes_first(cycle, cand, taken):
        return False
    cycle.commit_preemption(cand, taken, "reclaim", _note(cycle.accounts, job.project, taken))
    return True


def _givers(cycle: PoolCycle, claimant: str, within_quota: bool) -> dict[str, int]:
    """The other projects that may give GPUs now, with what each holds. Only a project above
    its threshold gives GPUs, and what it holds only falls as victims are taken: the projects
    at or below theirs can be left out from the start."""
    held: dict[str, int] = {}
    for project in cycle.victims.jobs():
        if project != claimant:
            victim = cycle.accounts.account(project)
            if may_give(victim, victim.usage, within_quota):
                held[project] = victim.usage
    return held


#: A project's next victim: how early it would be taken (`first_taken`), the project's place
#: among the givers (equal keys go to the first, as a scan in that order finds it), the victim
#: and what it frees
Offer = tuple["FirstTaken", int, Unit, list[Replica]]


class _ServedLast:
    """Picks the next victim from the project that would be served last without it
    (`served_last_key`), while that project may still give (`may_give`).

    Each project's next victim and how late the project would then be served change only
    when that project gives one (one Taken is passed along): the offers are kept in a heap,
    and only the giver's is looked at again. Scanning every giver's offer at every pick cost
    the number of projects for each victim, and a claimant waiting for a whole node takes
    hundreds of victims at 4x the bench's size. It walks for a claimant pinned to a node or
    publishing ports; any other takes `reclaim_order.first_fit`, which decides the same."""

    def __init__(
        self, cycle: PoolCycle, held: dict[str, int], within_quota: bool, pin: str | None
    ) -> None:
        self.cycle = cycle
        self.held = held  # what each giving project holds, less the victims taken
        self.within_quota = within_quota
        self.pin = pin
        self.offers: list[Offer] | None = None
        self.place = {project: i for i, project in enumerate(held)}
        self.gave: str | None = None  # its next offer is looked at once its victim is taken

    def __call__(self, taken: Taken) -> tuple[Unit, list[Replica]] | None:
        if self.offers is None:
            self.offers = []
            for project in self.held:
                self._offer(project, taken)
        elif self.gave is not None:
            self._offer(self.gave, taken)
        if not self.offers:
            return None
        _, _, unit, freed = heapq.heappop(self.offers)
        self.held[unit.project] -= len(freed) * unit.job.gpus
        self.gave = unit.project
        return unit, freed

    def _offer(self, project: str, taken: Taken) -> None:
        assert self.offers is not None
        victim = self.cycle.accounts.account(project)
        now_held = self.held[project]
        if not may_give(victim, now_held, self.within_quota):
            return
        found = next_unit(self.cycle, project, taken, self.pin, _any)
        if found is None:
            return
        unit, freed = found
        left = now_held - len(freed) * unit.job.gpus
        first = first_taken(served_last_key(victim, now_held, left))
        heapq.heappush(self.offers, (first, self.place[project], unit, freed))


def _note(accounts: Accounts, project: str, taken: Taken) -> str:
    """The stop request's words: where the claimant and each giving project stood."""
    claimant = accounts.account(project)
    return (
        f"{project} holds {claimant.usage} of its fair share {claimant.fair_share} "
        f"(quota {claimant.quota}); "
        + "; ".join(
            f"{p} held {accounts.account(p).usage}, fair share {accounts.account(p).fair_share}, "
            f"quota {accounts.account(p).quota}"
            for p in taken.freed_by_project
        )
    )


def _a_victim_comes_back(cycle: PoolCycle, taken: Taken) -> bool:
    """Rule 5, for a claimant above its quota: would the victims leave a project below its
    quota (counted at most up to its limit) while one of them would fit within that quota
    again? That project would take it straight back by the quota rule, and round it goes. A
    victim too large to come back within the quota may still be taken."""
    smallest: dict[str, int] = {}
    for unit, gpus in zip(taken.units, taken.gpus_freed, strict=True):
        smallest[unit.project] = min(gpus, smallest.get(unit.project, gpus))
    for project, freed in taken.freed_by_project.items():
        victim = cycle.accounts.account(project)
        quota = min(victim.quota, victim.limit)
        left = victim.usage - freed
        if left < quota and left + smallest[project] <= quota:
            return True
    return False


def _could_free_enough(
    cycle: PoolCycle, cand: Candidate, held: dict[str, int], within_quota: bool
) -> bool:
    """A quick upper bound before looking at victims one by one: a project gives GPUs only
    while it holds more than its threshold, and its last victim overshoots by at most one unit."""
    job = cand.job
    room = cycle.capacity.free_on(job.node) if job.node else cycle.capacity.total_free
    room += sum(len(g) for node, g in cycle.releasing.items() if job.node in (None, node))
    for project, now_held in held.items():
        victim = cycle.accounts.account(project)
        floor = min(victim.quota, victim.limit) if within_quota else threshold(victim)
        if now_held > floor:
            room += min(now_held, now_held - floor + cycle.victims.largest_unit_gpus(project))
        if room >= cand.gpus:
            return True
    return room >= cand.gpus


def _any(unit: Unit) -> bool:
    return True


def _claimant_goes_first(cycle: PoolCycle, cand: Candidate, taken: Taken) -> bool:
    """Anti ping-pong: queue the victims again beside the claimant, with the GPUs they free,
    in allocation order (the same project turns, each project's jobs in job order, its usage
    reduced by the victims); the claimant must be the first of them to be placed, or a victim
    would take its GPUs straight back."""
    requeued = [cand]
    for victim, replicas in taken.requests():
        if replicas:
            requeued.append(Candidate(victim, 1, extra=True, before=victim.min_replicas))
        else:
            requeued.append(Candidate(victim, victim.min_replicas))
    book = cycle.accounts
    accounts = {
        p: replace(book.account(p), usage=book.account(p).usage - g)
        for p, g in taken.freed_by_project.items()
    }
    queues: dict[str, list[Candidate]] = {}
    for c in requeued:
        queues.setdefault(c.job.project, []).append(c)
    for q in queues.values():
        q.sort(key=job_key)
    while queues:
        project = min(
            queues,
            key=lambda p: project_key(accounts.get(p) or book.account(p), queues[p][0]),
        )
        c = queues[project].pop(0)
        if not queues[project]:
            del queues[project]
        if c is cand:
            return True
        acct = accounts.get(project) or book.account(project)
        if gate_ok(acct, c) and fits_with(cycle, c, taken):
            return False
    return True
