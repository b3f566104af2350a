"""Rule 5's taking order, and where in it a claimant first fits.

A reclaim takes victims one at a time from the project that would be served last without the
victim. How late a project would be served depends only on what it holds, so each giving
project's own victims come in an order (and with keys) that no other project's victims change:
the taking order is a merge of each project's own list, by key. Each list (`Offers`) is worked
out once per cycle, listed at least as far as the project may give to anyone, and patched as
the project's usage and victims change (`VictimIndex.passed`), so the claimants of one cycle
read most projects' lists again instead of working them out victim by victim. The lists report
what they could ever free per node to the cycle's `Reach` (`reclaim_reach`).

`first_fit` merges the lists until the claimant fits, counting only the GPUs each victim frees
per node: the victims' other bookkeeping (`Taken`) is worked out for those that can matter,
the jobs freeing GPUs on a node where the claimant gains room. A victim of any other job frees
GPUs only on nodes where no subset of the victims adds room, so sparing (`spare_unneeded`)
spares it whatever else is kept, and it changes no other victim's fate.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from typing import Protocol

from events import Replica
from policy.accounts import Account, Accounts
from policy.candidates import Candidate
from policy.schedulers.reclaim_reach import PerNode, Reach
from policy.victim_search import (
    SearchCycle,
    Taken,
    new_taken,
    overlay_fit,
    spare_unneeded,
    taken_of,
)
from policy.victims import Lineup, Unit, is_near, look_up_after


class ReclaimCycle(SearchCycle, Protocol):
    """What the reclaim order reads and keeps in the pool's cycle (`pool_cycle.PoolCycle`,
    which calls it): its accounts, and the lists and reach kept there for the cycle, with the
    projects whose holdings moved since they were brought up to date."""

    @property
    def accounts(self) -> Accounts: ...

    reach: Reach | None
    moved: set[str]
    reclaim_offers: dict[str, Offers]


ServedLastKey = tuple[bool, bool, int, float, int]
FirstTaken = tuple[bool, bool, int, float, int]
_UNKEYED: tuple[FirstTaken | None] = (None,)


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
    the project holds before it is taken (`held`) and how early it is taken (`key`): listed at
    least while the project may give to any claimant (above its lower floor), further as far
    as a walk has asked. A list depends on no other project, and on no claimant: whoever
    claims, the project's victims come in this order, for as long as it may give
    (`may_give`). It is kept for the cycle and brought up to date as the project's usage and
    victims change (`update`).

    What the project holds before each entry is kept as it was at one usage (`stock`, at
    `_base`): a change of its usage alone moves what it holds before every entry by as much,
    and changes nothing kept.
    The entries above each floor (the first `ends[f]`) are kept up to date, and what they
    free per node reported to the cycle's `Reach` as it changes."""

    __slots__ = (
        "_at",
        "_base",
        "_changes",
        "_cycle",
        "_keyed_at",
        "_left",
        "_lineup",
        "_surplus",
        "_usage",
        "ends",
        "floors",
        "freed",
        "keys",
        "places",
        "sizes",
        "stock",
        "units",
        "victim",
    )

    def __init__(self, cycle: ReclaimCycle, project: str) -> None:
        self._cycle = cycle
        self.victim = cycle.accounts.account(project)
        self._usage = self._base = self.victim.usage
        self._left = self._base  # what it holds after the last listed (at the usage `_base`)
        self._changes = len(cycle.victims.passed.get(project, ()))
        self._lineup: Lineup | None = None  # the project's victims, once a list is asked for
        self._at = 0  # where the lineup is read up to
        self._surplus: dict[str, int] = {}  # surplus replicas listed, per job
        self.units: list[Unit] = []
        self.freed: list[list[Replica]] = []
        self.sizes: list[int] = []  # the GPUs each frees (its replicas' of its job's size)
        self.stock: list[int] = []  # what the project holds before each, at the usage `_base`
        self.places: list[int] = []  # where each is in the lineup
        #: how early each is taken, worked out when first asked (None: not yet), at a usage
        #: `_keyed_at` above `_base`; a walk asks only for the entries it does not pass over
        self.keys: list[FirstTaken | None] = []
        self._keyed_at = 0
        self.floors = (floor(self.victim, False), floor(self.victim, True))
        self.ends = [0, 0]
        self.to_floors()

    def current(self) -> bool:
        """Is the list still what the project's victims are? It changes only when the
        project's usage does or a victim of it is taken for good this cycle."""
        project = self.victim.project
        return (
            self.victim.usage == self._usage
            and len(self._cycle.victims.passed.get(project, ())) == self._changes
        )

    def held(self, i: int) -> int:
        """What the project holds before its i-th entry is taken (listed already)."""
        return self.stock[i] + self.victim.usage - self._base

    def offer(self, i: int, below: int) -> bool:
        """Is there an i-th victim, taken while the project holds more than `below`?"""
        shift = self.victim.usage - self._base
        while len(self.units) <= i:
            # what it holds only falls down the list: a project at or below `below` after the
            # last listed gives no more, and its victims need not be sorted or listed
            if self._left + shift <= below or not self._list_next(len(self.lineup().units)):
                return False
        return self.stock[i] + shift > below

    def listed_to(self) -> int:
        """Where in the lineup listing has read to: every entry is of a unit before it."""
        return self._at

    def lineup(self) -> Lineup:
        """The project's victim units in taking order (`VictimIndex.lineup`)."""
        if self._lineup is None:
            self._lineup = self._cycle.victims.lineup(self.victim.project)
        return self._lineup

    def key(self, i: int) -> FirstTaken:
        """How early the i-th entry (listed already) is taken (`first_taken`)."""
        shift = self.victim.usage - self._base
        keys = self.keys
        if shift != self._keyed_at:
            keys.clear()
            self._keyed_at = shift
        if len(keys) <= i:
            keys.extend([None] * (i + 1 - len(keys)))
        found = keys[i]
        if found is None:
            held = self.stock[i] + shift
            found = keys[i] = first_taken(served_last_key(self.victim, held, held - self.sizes[i]))
        return found

    def update(self) -> bool:
        """Bring the list up to date with the project's usage and victims; False if it must
        be listed afresh (a victim taken that was not listed).

        Rebuilding threw away what was listed at every preemption, and the project that just
        gave is often the next to give. Taking listed victims changes no other entry but what
        the project holds before those listed ahead of them, and which replica a surplus
        replica ahead of them of the same job frees (`_take_out`): each entry after them had
        them counted before it, and a surplus replica after them frees the same replica of
        its job (its job's replicas given up are those listed before it)."""
        news = self._cycle.victims.passed.get(self.victim.project, [])[self._changes :]
        gone = self._gone(news)
        if gone is None:
            return False
        self._changes += len(news)
        self._usage = self.victim.usage
        if gone:
            self._take_out(gone)
        self.to_floors()
        return True

    def _take_out(self, gone: list[int]) -> None:
        """The entries `gone` (ascending) are taken: they leave the list and the reach, and
        those ahead of each hold what it frees less (`to_floors` then moves the floors).

        Listing the entries up to the last taken again read each one's job and replicas, and
        victims are taken deeper down the lists the larger the pool: the entries ahead are
        patched instead, their objects left unread."""
        kept, ends, sizes, stock = self._kept(), self.ends, self.sizes, self.stock
        for f in kept:
            for i in gone:
                if i < ends[f]:
                    self._report(f, i, i + 1, -1)
        for f in kept:
            ends[f] -= bisect.bisect_left(gone, ends[f])
        surplus, changed = self._surplus, set()
        for i in gone:
            # what the project holds before every entry ahead falls by what this one frees
            stock[:i] = map(operator.sub, stock[:i], itertools.repeat(sizes[i], i))
            unit = self.units[i]
            if unit.surplus:
                job_id = unit.job.id
                surplus[job_id] -= 1
                if not surplus[job_id]:
                    del surplus[job_id]
                changed.add(job_id)
        last = gone[-1]
        keys, keyed_at = self.keys, self._keyed_at
        self._base -= sum(sizes[i] for i in gone)
        for i in reversed(gone):
            del self.units[i], self.freed[i], sizes[i], stock[i], self.places[i]
            if i < len(keys):
                del keys[i]
        ahead = last + 1 - len(gone)  # the entries that were ahead of the last taken
        if self.victim.usage - self._base == keyed_at:
            keys[: min(ahead, len(keys))] = _UNKEYED * min(
                ahead, len(keys)
            )  # the others keep theirs
        else:
            keys.clear()
        for job_id in changed - self._cycle.victims.gone:
            self._free_again(job_id)

    def _free_again(self, job_id: str) -> None:
        """Work out again which replica each listed surplus replica of the job frees (as
        `_list_next` does), reporting the changes: one of its surplus replicas was taken, so
        those listed ahead of it free the next older one."""
        lineup, places, units = self.lineup(), self.places, self.units
        stopped = self._cycle.surplus_stopped.get(job_id, 0)
        ahead = 0
        for place in lineup.positions(job_id):
            i = bisect.bisect_left(places, place)
            if i == len(places) or places[i] != place or not units[i].surplus:
                continue
            job = units[i].job
            freed = [job.held[job.active_replicas - stopped - ahead - 1]]
            ahead += 1
            if freed != self.freed[i]:
                for f in self._kept():
                    if i < self.ends[f]:
                        self._report(f, i, i + 1, -1)
                self.freed[i] = freed
                for f in self._kept():
                    if i < self.ends[f]:
                        self._report(f, i, i + 1, 1)

    def _gone(self, news: list[str | Unit]) -> list[int] | None:
        """The listed entries these changes took (ascending), or None if a unit spent was
        not listed (what its job's entries free changed)."""
        gone: set[int] = set()
        if not self.units:
            return []  # nothing listed that a change could touch
        for change in news:
            if isinstance(change, Unit):
                i = self._entry(change)
                if i is None:
                    return None
                gone.add(i)
            else:  # a job taken for good: all its units that are listed
                for place in self.lineup().positions(change):
                    i = bisect.bisect_left(self.places, place)
                    if i < len(self.places) and self.places[i] == place:
                        gone.add(i)
        return sorted(gone)

    def _entry(self, unit: Unit) -> int | None:
        """Which entry lists this unit (None if none does)."""
        lineup, places = self.lineup(), self.places
        for place in lineup.positions(unit.job.id):
            if lineup.units[place] is unit:
                i = bisect.bisect_left(places, place)
                return i if i < len(places) and places[i] == place else None
        return None

    def to_floors(self) -> None:
        """Move each floor's end to the first entry taken at or below it, reporting what
        comes in and goes out."""
        for f in self._kept():
            below, end = self.floors[f], self.ends[f]
            while end and self.held(end - 1) <= below:
                end -= 1
                self._report(f, end, end + 1, -1)
            while self.offer(end, below):
                self._report(f, end, end + 1, 1)
                end += 1
            self.ends[f] = end

    def _report(self, f: int, start: int, stop: int, sign: int) -> None:
        """Entries start..stop-1 come above floor f (sign 1) or go (-1)."""
        for node, gpus in self._per_node(start, stop).items():
            self._shift(f, node, sign * gpus)

    def _per_node(self, start: int, stop: int) -> PerNode:
        """The GPUs entries start..stop-1 free, per node."""
        found: PerNode = {}
        for i in range(start, stop):
            for r in self.freed[i]:
                found[r.node] = found.get(r.node, 0) + len(r.gpus)
        return found

    def _shift(self, f: int, node: str, gpus: int) -> None:
        """The entries above floor f free `gpus` more GPUs on `node` (fewer if < 0)."""
        if gpus:
            reach = self._cycle.reach
            assert reach is not None, "a list is made once the cycle has its reach"
            reach.shift(f, node, gpus)

    def _kept(self) -> tuple[int, ...]:
        """The floors the cycle's reach keeps (`Reach.kept`)."""
        reach = self._cycle.reach
        assert reach is not None, "a list is made once the cycle has its reach"
        return reach.kept

    def drop(self) -> None:
        """The list is replaced: what it reported goes."""
        for f in self._kept():
            self._report(f, 0, self.ends[f], -1)
            self.ends[f] = 0

    def _list_next(self, end: int) -> bool:
        """List the next victim unit before lineup position `end` that frees GPUs (as
        `next_unit` and `Taken.replicas_freed` find it, with none of the project's victims
        taken but those before it)."""
        cycle, lineup = self._cycle, self.lineup()
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
                    size = len(freed) * job.gpus
                    self._at = i + 1
                    self.units.append(unit)
                    self.freed.append(freed)
                    self.sizes.append(size)
                    self.stock.append(self._left)
                    self.places.append(i)
                    self._left -= size
                    return True
            i = lineup.live_from(i + 1)
        self._at = i
        return False


def reach_of(cycle: ReclaimCycle, floor: int | None = None) -> Reach:
    """The cycle's reach, with every project's list up to date (made at the first ask, with
    a list for every project that has victims), keeping `floor` from now on if given.

    A floor is kept from the first claimant that needs it: the lower floor lists every
    project down to its quota, most of its victims in a settled cluster, where a claimant
    above its quota (the higher floor) is the common one."""
    reach = cycle.reach
    if reach is None:
        reach = cycle.reach = Reach(cycle)
        for project in cycle.victims.jobs():
            cycle.reclaim_offers[project] = Offers(cycle, project)
        cycle.moved.clear()
    for project in cycle.moved:
        if project in cycle.reclaim_offers:
            offers_of(cycle, project)
    cycle.moved.clear()
    if floor is not None and floor not in reach.kept:
        reach.kept += (floor,)
        for offers in cycle.reclaim_offers.values():
            offers.to_floors()
    return reach


def offers_of(cycle: ReclaimCycle, project: str) -> Offers:
    """The project's list, kept in the cycle and brought up to date."""
    found = cycle.reclaim_offers[project]
    if not (found.current() or found.update()):
        found.drop()
        found = cycle.reclaim_offers[project] = Offers(cycle, project)
    return found


def could_fit(cycle: ReclaimCycle, cand: Candidate, within_quota: bool) -> bool:
    """Could a claimant on no node in particular fit if every other project gave every
    victim it may? If not, no walk makes it fit (`Reach`)."""
    f = int(within_quota)
    return reach_of(cycle, f).could_fit(cand, f)


def first_fit(
    cycle: ReclaimCycle, cand: Candidate, givers: list[str], within_quota: bool
) -> Taken | None:
    """`take_until_fits` with the served-last pick, for a claimant on no node in particular
    that publishes no ports: the victims the givers' merged lists give until the claimant fits,
    those it can do without spared. None if it never fits.

    Replicas of several GPUs, where few nodes are hopeful (`Reach.few`), pass over the entries
    of jobs with no replica on a node where victims could make room for one (`Reach.hopeful`)
    without counting what they free: such a job frees GPUs only on nodes where no replica of
    the claimant ever fits, so it never adds a place for one (however many replicas), is never
    kept (`_gaining`), and the others come in the same order without it. A claimant waiting
    for a whole node took hundreds of victims of such jobs at 4x the bench's size before one
    freed a node, each counted GPU by GPU; a gang waiting for two whole nodes, over 500.
    Passing over those entries one by one still grew with the pool (the gaps between near jobs
    do), so a list it has passed over for a while is looked up by node instead (`_Hopeful`),
    which finds the same entries."""
    f = int(within_quota)
    gpus = cand.job.gpus
    narrow = gpus > 1
    reach = reach_of(cycle, f if narrow else None)
    lists = [cycle.reclaim_offers[project] for project in givers]  # up to date: reach_of
    below = [offers.floors[f] for offers in lists]
    releasing = new_taken(cycle).overlay
    fit = overlay_fit(cycle, cand, releasing)
    if fit.fits():
        return new_taken(cycle)
    hopeful = (
        _Hopeful(reach.hopeful(f, gpus), len(lists)) if narrow and reach.few(f, gpus) else None
    )
    heap: list[tuple[FirstTaken, int, int]] = []
    for place, offers in enumerate(lists):
        _queue_next(heap, offers, place, 0, below[place], hopeful)
    # per node, the GPUs freed so far and how many (as `Taken.add` counts them: once each)
    seen: dict[str, set[int]] = {}
    sizes: dict[str, int] = {}
    order: list[tuple[int, int]] = []  # (place, i): the victims taken, in taking order
    while not fit.fits():
        if not heap:
            return None
        _, place, i = heapq.heappop(heap)
        offers = lists[place]
        order.append((place, i))
        for r in offers.freed[i]:
            node = r.node
            taken = seen.get(node)
            if taken is None:
                taken = seen[node] = set(releasing.get(node, ()))
                sizes[node] = len(releasing.get(node, ()))
            before = len(taken)
            taken.update(r.gpus)
            if len(taken) != before:
                sizes[node] += len(taken) - before
                fit.resize(node, sizes[node])
        _queue_next(heap, offers, place, i + 1, below[place], hopeful)
    gaining = _gaining(cycle, cand, sizes)
    units = [lists[place].units[i] for place, i in order]
    matter = {
        units[k].job.id
        for k, (place, i) in enumerate(order)
        if any(r.node in gaining for r in lists[place].freed[i])
    }
    kept = [unit for unit in units if unit.job.id in matter]
    return spare_unneeded(cycle, cand, taken_of(cycle, kept), None)


class _Hopeful:
    """A walk's hopeful nodes, and per list (by its place among the givers) how many entries
    of jobs on none of them it has passed over, or, once looked up by node
    (`Lineup.on_nodes`), the list's entries of jobs on one, ascending, and how many entries
    were listed then.

    Passing over entries costs the gap to the next near one, which grows with the pool; a
    look-up costs about one ask per hopeful node, however long the list. A list is looked up
    once passing over it has cost about as much, so a walk spends at most about twice the
    cheaper of the two on it, whichever that is."""

    __slots__ = ("listed", "looked_up", "nodes", "passed")

    def __init__(self, nodes: set[str], lists: int) -> None:
        self.nodes = nodes
        self.passed = [0] * lists
        self.looked_up: list[list[int] | None] = [None] * lists
        self.listed = [0] * lists

    def look_up(self, offers: Offers, place: int) -> list[int]:
        """The list's entries listed so far of jobs on a hopeful node, ascending."""
        places, found = offers.places, []
        for position in offers.lineup().on_nodes(self.nodes, offers.listed_to()):
            i = bisect.bisect_left(places, position)
            if i < len(places) and places[i] == position:
                found.append(i)
        self.looked_up[place], self.listed[place] = found, len(places)
        return found


def _pass_over(  # noqa: PLR0913 (as `_queue_next`)
    heap: list[tuple[FirstTaken, int, int]],
    offers: Offers,
    place: int,
    i: int,
    below: int,
    hopeful: _Hopeful,
) -> int | None:
    """`_queue_next` entry by entry, until passing over the list has cost as much as looking
    it up by node would: then where it stopped (None if it queued an entry or the list
    ended)."""
    budget = look_up_after(hopeful.nodes)
    passed = hopeful.passed
    while passed[place] < budget:
        if not offers.offer(i, below):
            return None
        if is_near(offers.units[i], hopeful.nodes):
            heapq.heappush(heap, (offers.key(i), place, i))
            return None
        passed[place] += 1
        i += 1
    return i


def _queue_next(  # noqa: PLR0913 (a walk's heap, and where it is in one list)
    heap: list[tuple[FirstTaken, int, int]],
    offers: Offers,
    place: int,
    i: int,
    below: int,
    hopeful: _Hopeful | None,
) -> None:
    """Queue the list's next entry from i on of a job on a hopeful node (on any, if None),
    passing over the others without working out how early they are taken: a list's keys
    never fall down it (what its project holds only falls), so the entries queued leave the
    heap in the order they would among all. Keying and queueing every entry passed over
    grew ten times for four times the cluster: a walk for a whole node passes more jobs
    on other nodes the more nodes there are."""
    if hopeful is None:
        if offers.offer(i, below):
            heapq.heappush(heap, (offers.key(i), place, i))
        return
    near = hopeful.looked_up[place]
    if near is None:
        stopped = _pass_over(heap, offers, place, i, below, hopeful)
        if stopped is None:
            return
        i, near = stopped, hopeful.look_up(offers, place)
    k = bisect.bisect_left(near, i)
    if k < len(near):
        # the project may give an entry only while it may give every one before it
        if offers.offer(near[k], below):
            heapq.heappush(heap, (offers.key(near[k]), place, near[k]))
        return
    # past the entries looked up: any listed since (none, within one walk) are passed over
    # one by one, as before the look-up
    i = max(i, hopeful.listed[place])
    while offers.offer(i, below):
        if is_near(offers.units[i], hopeful.nodes):
            heapq.heappush(heap, (offers.key(i), place, i))
            return
        i += 1


def _gaining(cycle: ReclaimCycle, cand: Candidate, sizes: dict[str, int]) -> set[str]:
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
