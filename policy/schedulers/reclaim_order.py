"""Rule 5's taking order, and where in it a claimant first fits.

A reclaim takes victims one at a time from the project that would be served last without the
victim. How late a project would be served depends only on what it holds, so each giving
project's own victims come in an order (and with keys) that no other project's victims change:
the taking order is a merge of each project's own list, by key. Each list (`Offers`) is worked
out once and kept while what it depends on stands (the project's usage, and its victims: none
taken for good since, `VictimIndex.passed`), so the claimants of one cycle read most projects'
lists again instead of working them out victim by victim.

`first_fit` merges the lists until the claimant fits, counting only the GPUs each victim frees
per node: the victims' other bookkeeping (`Taken`) is worked out for those that can matter,
the jobs freeing GPUs on a node where the claimant gains room. A victim of any other job frees
GPUs only on nodes where no subset of the victims adds room, so sparing (`spare_unneeded`)
spares it whatever else is kept, and it changes no other victim's fate.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from events import Replica
from policy.accounts import Account
from policy.candidates import Candidate
from policy.victim_search import Taken, new_taken, overlay_fit, spare_unneeded, taken_of
from policy.victims import Unit

if TYPE_CHECKING:
    from policy.pool_cycle import PoolCycle

ServedLastKey = tuple[bool, bool, int, float, int]
FirstTaken = tuple[bool, bool, int, float, int]


def threshold(victim: Account) -> int:
    """What a victim's project must hold more than to give GPUs: the larger of its quota and
    its fair share, each counted at most up to its limit."""
    return max(min(victim.quota, victim.limit), min(victim.fair_share, victim.limit))


def floor(victim: Account, claimant_within_quota: bool) -> int:
    """Rule 5: a project gives a victim only while it holds more than this (`may_give`). A
    claimant within its quota may take from a project above its quota, which the threshold
    (never below the quota) covers too."""
    if claimant_within_quota:
        return min(victim.quota, victim.limit)
    return threshold(victim)


def may_give(victim: Account, now_held: int, claimant_within_quota: bool) -> bool:
    """Rule 5: before each victim is taken, its project holds more than its threshold, or the
    claimant is within its quota and the victim's project above its quota."""
    return now_held > floor(victim, claimant_within_quota)


def served_last_key(victim: Account, now_held: int, left: int) -> ServedLastKey:
    """How late the victim's project would be served if the victim were gone (`left` GPUs):
    over its fair share, then over its quota, then lower project priority, then the larger
    part of its fair share in use now (a fair share of 0 with GPUs held: infinitely over),
    then the newer project. Larger is later."""
    fair = victim.fair_share
    share = now_held / fair if fair else (float("inf") if now_held else 0.0)
    return (left > fair, left > victim.quota, -victim.priority, share, victim.order)


def first_taken(key: ServedLastKey) -> FirstTaken:
    """The served-last key turned around, so that the smallest is taken first (a heap's)."""
    over_share, over_quota, priority, share, order = key
    return (not over_share, not over_quota, -priority, -share, -order)


class Offers:
    """One project's victims in the order a reclaim takes them, each with what it frees, what
    the project holds before it is taken and how early it is taken (`first_taken`): listed as
    far as a walk has asked, and valid while the project's usage and victims stay as they were
    (`current`), or patched once victims listed in it are taken (`patch`). A list depends on
    no other project, and on no claimant: whoever claims, the project's victims come in this
    order, for as long as it may give (`may_give`)."""

    __slots__ = (
        "_at",
        "_changes",
        "_cycle",
        "_left",
        "_lineup",
        "_surplus",
        "_usage",
        "freed",
        "held",
        "keys",
        "places",
        "units",
        "victim",
    )

    def __init__(self, cycle: PoolCycle, project: str) -> None:
        self._cycle = cycle
        self.victim = cycle.accounts.account(project)
        self._usage = self._left = self.victim.usage  # what it holds after the last listed
        self._changes = len(cycle.victims.passed.get(project, ()))
        self._lineup = cycle.victims.lineup(project)
        self._at = 0  # where the lineup is read up to
        self._surplus: dict[str, int] = {}  # surplus replicas listed, per job
        self.units: list[Unit] = []
        self.freed: list[list[Replica]] = []
        self.held: list[int] = []  # what the project holds before each is taken
        self.keys: list[FirstTaken] = []
        self.places: list[int] = []  # where each is in the lineup

    def current(self) -> bool:
        """Is the list still what the project's victims are? It changes only when the
        project's usage does (its keys) or a victim of it is taken for good this cycle."""
        project = self.victim.project
        return (
            self.victim.usage == self._usage
            and len(self._cycle.victims.passed.get(project, ())) == self._changes
        )

    def offer(self, i: int, below: int) -> bool:
        """Is there an i-th victim, taken while the project holds more than `below`?"""
        while len(self.units) <= i:
            if not self._list_next(len(self._lineup.units)):
                return False
        return self.held[i] > below

    def patch(self) -> bool:
        """Bring the list up to date after victims listed in it were taken, if that is all
        that changed; False if it must be listed afresh.

        Rebuilding threw away what was listed at every preemption, and the project that just
        gave is often the next to give. Taking victims up to the list's l-th entry changes
        nothing after it: the project holds what those victims freed less, and each entry
        after them had it counted before it (the same held, the same key); a surplus replica
        after them frees the same replica of its job (its job's replicas given up are those
        listed before it). Only the entries up to the l-th are listed again."""
        news = self._cycle.victims.passed.get(self.victim.project, [])[self._changes :]
        spent = {id(x) for x in news if isinstance(x, Unit)}
        jobs = {x for x in news if isinstance(x, str)}  # taken whole, or nominated or grown
        if not spent or not jobs <= {x.job.id for x in news if isinstance(x, Unit)}:
            return False  # a job of it nominated or grown: its usage grew
        units, taken, found, last = self.units, 0, 0, -1
        while found < len(spent):  # a job taken whole lists its extras before its whole unit
            last += 1
            if last == len(units):
                return False  # a victim not listed was taken
            unit = units[last]
            if id(unit) in spent:
                found += 1
            elif unit.job.id not in jobs:
                continue
            taken += len(self.freed[last]) * unit.job.gpus
        if self.victim.usage != self._usage - taken:
            return False
        self._relist(last)
        self._usage, self._changes = self.victim.usage, len(news) + self._changes
        return True

    def _relist(self, last: int) -> None:
        """List again the entries up to the `last`-th, keeping those after it."""
        tail = (self.units, self.freed, self.held, self.keys, self.places)
        left, at, surplus = self._left, self._at, self._surplus
        for unit in self.units[: last + 1]:
            if unit.surplus:
                surplus[unit.job.id] -= 1
                if not surplus[unit.job.id]:
                    del surplus[unit.job.id]
        self.units, self.freed, self.held, self.keys, self.places = [], [], [], [], []
        self._left, self._at, self._surplus = self.victim.usage, 0, {}
        while self._list_next(tail[4][last] + 1):
            pass
        for job_id, count in self._surplus.items():
            surplus[job_id] = surplus.get(job_id, 0) + count
        self.units.extend(tail[0][last + 1 :])
        self.freed.extend(tail[1][last + 1 :])
        self.held.extend(tail[2][last + 1 :])
        self.keys.extend(tail[3][last + 1 :])
        self.places.extend(tail[4][last + 1 :])
        self._left, self._at, self._surplus = left, at, surplus

    def _list_next(self, end: int) -> bool:
        """List the next victim unit before lineup position `end` that frees GPUs (as
        `next_unit` and `Taken.replicas_freed` find it, with none of the project's victims
        taken but those before it)."""
        cycle, lineup = self._cycle, self._lineup
        units, gone = lineup.units, cycle.victims.gone
        used, stopped, surplus = cycle.used_units, cycle.surplus_stopped, self._surplus
        i = lineup.live_from(self._at)
        while i < end:
            unit = units[i]
            job = unit.job
            if job.id not in gone and id(unit) not in used:
                active = job.active_replicas - stopped.get(job.id, 0) - surplus.get(job.id, 0)
                if not unit.surplus:
                    freed = job.held[:active]
                elif active > job.min_replicas:
                    freed = [job.held[active - 1]]
                    surplus[job.id] = surplus.get(job.id, 0) + 1
                else:
                    freed = []
                if freed:
                    self._at = i + 1
                    self._add(unit, freed, i)
                    return True
            i = lineup.live_from(i + 1)
        self._at = i
        return False

    def _add(self, unit: Unit, freed: list[Replica], place: int) -> None:
        now_held = self._left
        self._left = now_held - len(freed) * unit.job.gpus
        self.units.append(unit)
        self.freed.append(freed)
        self.held.append(now_held)
        self.keys.append(first_taken(served_last_key(self.victim, now_held, self._left)))
        self.places.append(place)


def offers_of(cycle: PoolCycle, project: str) -> Offers:
    """The project's list, kept in the cycle while it is current, patched where it can be."""
    found = cycle.reclaim_offers.get(project)
    if found is None or not (found.current() or found.patch()):
        found = cycle.reclaim_offers[project] = Offers(cycle, project)
    return found


def first_fit(
    cycle: PoolCycle, cand: Candidate, givers: list[str], within_quota: bool
) -> Taken | None:
    """`take_until_fits` with the served-last pick, for a claimant on no node in particular
    that publishes no ports: the victims the givers' merged lists give until the claimant fits,
    those it can do without spared. None if it never fits."""
    lists = [offers_of(cycle, project) for project in givers]
    below = [floor(offers.victim, within_quota) for offers in lists]
    heap = [
        (offers.keys[0], place, 0)
        for place, offers in enumerate(lists)
        if offers.offer(0, below[place])
    ]
    heapq.heapify(heap)
    releasing = new_taken(cycle).overlay
    fit = overlay_fit(cycle, cand, releasing)
    # per node, the GPUs freed so far and how many (as `Taken.add` counts them: once each)
    seen: dict[str, set[int]] = {}
    sizes: dict[str, int] = {}
    order: list[tuple[int, int]] = []  # (place, i): the victims taken, in taking order
    while not fit.fits():
        if not heap:
            return None
        _, place, i = heapq.heappop(heap)
        order.append((place, i))
        offers = lists[place]
        for r in offers.freed[i]:
            node = r.node
            gpus = seen.get(node)
            if gpus is None:
                gpus = seen[node] = set(releasing.get(node, ()))
                sizes[node] = len(releasing.get(node, ()))
            before = len(gpus)
            gpus.update(r.gpus)
            if len(gpus) != before:
                sizes[node] += len(gpus) - before
                fit.resize(node, sizes[node])
        if offers.offer(i + 1, below[place]):
            heapq.heappush(heap, (offers.keys[i + 1], place, i + 1))
    if not order:
        return new_taken(cycle)
    gaining = _gaining(cycle, cand, sizes)
    units = [lists[place].units[i] for place, i in order]
    matter = {
        units[k].job.id
        for k, (place, i) in enumerate(order)
        if any(r.node in gaining for r in lists[place].freed[i])
    }
    kept = [unit for unit in units if unit.job.id in matter]
    return spare_unneeded(cycle, cand, taken_of(cycle, kept), None)


def _gaining(cycle: PoolCycle, cand: Candidate, sizes: dict[str, int]) -> set[str]:
    """The nodes where the GPUs freed (`sizes`: the overlay's, per node) add room for a
    replica of the claimant. On any other node no subset of the victims adds any."""
    gpus, by_name, releasing = cand.job.gpus, cycle.capacity.by_name, cycle.releasing
    gaining: set[str] = set()
    for node, size in sizes.items():
        slot = by_name.get(node)
        if slot is not None:
            idle = len(slot.free)
            if (idle + size) // gpus > (idle + len(releasing.get(node, ()))) // gpus:
                gaining.add(node)
    return gaining
