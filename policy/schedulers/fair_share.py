"""The default scheduler: quotas, fair shares, in-project preemption and reclaim (Run:AI's rules).

Rules 2 to 7 and 9 (docs/rules.md). Projects take turns; after every job the
project that was served is ranked again, so a project that got GPUs steps back behind those that
have less of their share.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import replace

from events import Replica
from policy.capacity import Overlay
from policy.ledger import Account
from policy.pool_cycle import Candidate, PoolCycle, Shape, Taken, gate, gate_ok
from policy.victims import Unit

ProjectKey = tuple[bool, bool, int, float, float, int]


def project_key(acct: Account, cand: Candidate) -> ProjectKey:
    """Rule 2: not over fair share first, then within quota (with this job), then higher project
    priority, then the lower share of the fair share in use, then the older project."""
    return (
        acct.usage > acct.fair_share,
        acct.usage + cand.gpus > acct.quota,
        -acct.priority,
        acct.share_in_use(cand.gpus),
        acct.share_in_use(),
        acct.order,
    )


JobKey = tuple[int, int, int, int]


def job_key(cand: Candidate) -> JobKey:
    """Inside a project (rules 2 and 6): higher job priority first; among equal priority, jobs
    below their minimum, then extra replicas in rounds (every job's first extra, then every
    job's second, ...: round robin), then submission order."""
    job = cand.job
    if cand.extra:
        return (-cand.priority, 1, cand.before - job.min_replicas, job.seq)
    return (-cand.priority, 0, 0, job.seq)


#: A candidate queued after the start: job_key(cand) flattened, the order queued, the candidate
LaterItem = tuple[int, int, int, int, int, Candidate]


class _Queue:
    """One project's candidates in job order (job_key, then the order queued): a list sorted
    once, plus a heap for candidates queued later (an elastic job's next replica), which come
    after every listed candidate of the same job_key."""

    __slots__ = ("acct", "at", "items", "key", "key_gpus", "key_usage", "later")

    def __init__(self, acct: Account, items: list[Candidate]) -> None:
        self.acct = acct
        self.items = items
        self.at = 0
        self.later: list[LaterItem] = []
        # the project's key, remembered with the usage and request size it was computed for
        self.key: ProjectKey | None = None
        self.key_usage = 0
        self.key_gpus = 0

    def _later_first(self) -> bool:
        """Does the first candidate queued later go before the next listed one?"""
        return self.later[0][:4] < job_key(self.items[self.at])

    def front(self) -> Candidate | None:
        if self.at < len(self.items):
            if self.later and self._later_first():
                return self.later[0][5]
            return self.items[self.at]
        return self.later[0][5] if self.later else None

    def take(self) -> Candidate | None:
        if self.at < len(self.items) and not (self.later and self._later_first()):
            self.at += 1
            return self.items[self.at - 1]
        return heapq.heappop(self.later)[5] if self.later else None

    def rank(self, front: Candidate) -> ProjectKey:
        """project_key(acct, front), which changes only with the usage and the request size."""
        gpus, usage = front.gpus, self.acct.usage
        if self.key is None or usage != self.key_usage or gpus != self.key_gpus:
            self.key = project_key(self.acct, front)
            self.key_usage, self.key_gpus = usage, gpus
        return self.key

    def remaining(self) -> list[Candidate]:
        return self.items[self.at :] + [item[5] for item in self.later]


class Turns:
    """Projects taking turns, each with its own queue of candidates.

    A heap holds one entry per project with candidates left, keyed by `project_key` as it was
    when the project was last served (other projects are not ranked again when one is served).
    A project whose new key is still the smallest goes again without a trip through the heap.
    """

    def __init__(self, cycle: PoolCycle, cands: list[Candidate]) -> None:
        self.cycle = cycle
        self._tie = len(cands)  # candidates queued later go after those of the same job_key
        grouped: dict[str, list[Candidate]] = {}
        for cand in cands:
            grouped.setdefault(cand.job.project, []).append(cand)
        self.queues: dict[str, _Queue] = {}
        for project, items in grouped.items():
            items.sort(key=job_key)  # stable: equal keys keep the order given
            self.queues[project] = _Queue(cycle.ledger.account(project), items)
        self.heap: list[tuple[ProjectKey, str]] = []
        for project, q in self.queues.items():
            front = q.front()
            if front is not None:
                self.heap.append((q.rank(front), project))
        heapq.heapify(self.heap)

    def __iter__(self) -> Iterator[Candidate]:
        """The candidates in turn order. The loop body handles each one (and may `queue` what
        follows it) before its project is ranked again."""
        heap, queues = self.heap, self.queues
        while heap:
            _, project = heapq.heappop(heap)
            q = queues[project]
            while (cand := q.take()) is not None:
                yield cand
                front = q.front()
                if front is None:
                    break
                entry = (q.rank(front), project)
                if heap and not entry < heap[0]:
                    heapq.heappush(heap, entry)
                    break
                # else its new key is still the smallest: it would be popped straight back

    def queue(self, cand: Candidate) -> None:
        """Queue a candidate in its project (an elastic job's next replica)."""
        self._tie += 1
        item = (*job_key(cand), self._tie, cand)
        heapq.heappush(self.queues[cand.job.project].later, item)

    def remaining(self) -> list[Candidate]:
        """Every candidate not yet popped."""
        return [c for q in self.queues.values() for c in q.remaining()]


def allocate(cycle: PoolCycle, cands: list[Candidate]) -> list[Candidate]:
    """Place what fits on idle GPUs (rules 2, 3 and 6). Returns the candidates left waiting.

    Every candidate takes part in the turns, whether or not it could fit: a project is ranked
    with its next job in job order, and a job that does not fit is skipped when its turn comes.
    """
    left: dict[Shape, int] = {}  # candidates still queued, by shape
    fronts: dict[str, tuple[JobKey, Candidate]] = {}  # each project's first in job order
    for queued in cands:  # one pass for both: every pass over the queue reads every job
        shape = queued.shape()
        left[shape] = left.get(shape, 0) + 1
        key = job_key(queued)
        front = fronts.get(queued.project)
        if front is None or key < front[0]:  # the first of equal keys, as a stable sort has it
            fronts[queued.project] = (key, queued)
    if _nothing_fits(cycle, left, set()) and _first_turn_finds_no_fit(cycle, fronts):
        # The settled cycle's common case, found without putting every candidate in turn
        # order (sorting the whole queue made a settled cycle grow faster than the queue):
        # nothing fits the idle GPUs and the first turn goes to a candidate its gate lets
        # through, which does not fit; as below, then, every candidate waits.
        cycle.wait_for_room(cands)
        return list(cands)
    turns = Turns(cycle, cands)
    waiting: list[Candidate] = []
    no_fit: set[Shape] = set()  # idle GPUs only shrink during this pass
    for cand in turns:
        shape = cand.shape()
        left[shape] -= 1
        closed = gate(cycle.ledger.account(cand.job.project), cand)
        placed = False
        if closed is not None:
            cycle.waiting[cand.job.id] = closed
        elif shape in no_fit:
            cycle.waiting[cand.job.id] = "no_fit"
        else:
            placed = cycle.try_place(cand)
            if not placed:
                no_fit.add(shape)
                cycle.waiting[cand.job.id] = "no_fit"
                if _nothing_fits(cycle, left, no_fit):
                    # no candidate left could be placed: they all wait (their order does not
                    # matter: the preemption pass orders them by its own turns)
                    waiting.append(cand)
                    rest = turns.remaining()
                    cycle.wait_for_room(rest)
                    waiting.extend(rest)
                    return waiting
        if placed:
            follow = cand.follow_up()
            if follow is not None:
                shape = follow.shape()
                left[shape] = left.get(shape, 0) + 1
                turns.queue(follow)
        else:
            waiting.append(cand)
    return waiting


def _first_turn_finds_no_fit(cycle: PoolCycle, fronts: dict[str, tuple[JobKey, Candidate]]) -> bool:
    """Is the first candidate `Turns` would give (the front of the project ranked first) one
    its gate lets through? If so it is marked `no_fit` (the caller knows nothing fits)."""
    first: tuple[tuple[ProjectKey, str], Candidate] | None = None
    for project, (_, cand) in fronts.items():
        entry = (project_key(cycle.ledger.account(project), cand), project)  # as the heap's
        if first is None or entry < first[0]:
            first = (entry, cand)
    if first is None or not gate_ok(cycle.ledger.account(first[1].job.project), first[1]):
        return False
    cycle.waiting[first[1].job.id] = "no_fit"
    return True


def _nothing_fits(
    cycle: PoolCycle,
    left: dict[Shape, int],
    no_fit: set[Shape],
) -> bool:
    """Does no shape still queued fit the idle GPUs? (Shapes that do not are marked.)"""
    for shape, count in left.items():
        if count and shape not in no_fit:
            if cycle.capacity.fits(*shape):
                return False
            no_fit.add(shape)
    return True


def preempt(cycle: PoolCycle, waiting: list[Candidate]) -> None:
    """For jobs still waiting, in turn order: wait for releasing GPUs where they suffice
    (rule 7), else reclaim from other projects (rule 5), else take from lower-priority jobs of
    the same project (rule 4). A job still in its preemption_delay only waits for releasing
    GPUs: that preempts nobody, so the delay does not hold it back (rule 7)."""
    kept, delayed = _may_preempt(cycle, waiting)
    turns = Turns(cycle, kept)
    failed: dict[tuple[object, ...], int] = {}
    for cand in turns:
        if not cycle.may_ask(cand):
            continue
        job = cand.job
        if job.id in delayed:
            cycle.try_releasing(cand)
            continue
        # what a failure says nothing has changed for: same project, priority, preemptibility,
        # shape, kind of request (every candidate here is past its preemption_delay)
        memo = (
            job.project,
            job.priority,
            job.preemptible,
            job.gpus,
            cand.replicas,
            job.node,
            cand.extra,
        )
        if failed.get(memo) == cycle.generation:
            continue
        if cycle.try_releasing(cand):
            continue
        if not (try_reclaim(cycle, cand) or try_preempt_in_project(cycle, cand)):
            failed[memo] = cycle.generation


def _may_preempt(cycle: PoolCycle, waiting: list[Candidate]) -> tuple[list[Candidate], set[str]]:
    """The candidates that could reclaim (the project would stay within its fair share) or
    preempt in their project (lower-priority victims exist), and which of them are still in
    their preemption_delay (kept only while GPUs are being given back: all they may do is wait
    for those). Judged as the pass starts: a project whose standing changes during the pass is
    looked at again in the next cycle."""
    room: dict[str, int] = {}  # fair share less usage, per project
    lowest: dict[str, float] = {}  # the lowest priority of a possible victim, per project
    kept: list[Candidate] = []
    delayed: set[str] = set()
    now = cycle.now
    releasing = bool(cycle.releasing)
    # every job became pending at an event's time, at the latest the state's last: unless the
    # clock is behind the log, a job without a delay has waited long enough, and its
    # pending_since (a float elsewhere in memory) need not be read
    behind = now < cycle.state.last_time
    for cand in waiting:
        delay = cand.delay  # cycle.delay_passed, inline
        if (delay or behind) and now - cand.job.pending_since < delay:
            cycle.waiting[cand.job.id] = "preemption_delay"
            if not releasing:
                continue
            delayed.add(cand.job.id)
        project = cand.project
        left = room.get(project)
        if left is None:
            acct = cycle.ledger.account(project)
            left = room[project] = acct.fair_share - acct.usage
        if cand.gpus <= left:
            kept.append(cand)
            continue
        low = lowest.get(project)
        if low is None:
            low = lowest[project] = cycle.lowest_victim_priority(project)
        if low < cand.priority:
            kept.append(cand)
    return kept, delayed


def try_preempt_in_project(cycle: PoolCycle, cand: Candidate) -> bool:
    """Rule 4: take from running preemptible jobs of the same project with strictly lower
    priority, only if the job then fits on the nodes and within the project's limit (a job
    held back only by the limit may preempt to get under it), a non-preemptible job within
    quota, and only if the project then holds no more than its fair share."""
    job = cand.job
    acct = cycle.ledger.account(job.project)
    if not job.preemptible and acct.np_usage + cand.gpus > acct.quota:
        return False
    if cycle.lowest_victim_priority(job.project) >= job.priority:
        # no victim of lower priority is left (the count may include units already taken,
        # never too few): looking would walk every unit of the project for nothing
        return False
    over_limit = acct.usage + cand.gpus - acct.limit  # what victims must free to get under it
    if over_limit <= 0 and not _could_end_within_fair_share(cycle, cand, acct):
        return False

    def lower(unit: Unit) -> bool:
        return unit.job.priority < job.priority

    def under_limit(freed_by_project: Mapping[str, int]) -> bool:
        return freed_by_project.get(job.project, 0) >= over_limit

    taken = cycle.take_until_fits(
        cand,
        lambda t: cycle.next_unit(job.project, t, job.node, lower),
        under_limit if over_limit > 0 else None,
    )
    if taken is None or not taken.units:
        return False
    if acct.usage - taken.freed_by_project.get(job.project, 0) + cand.gpus > acct.fair_share:
        return False  # a reclaim would undo it at once
    note = f"{job.project}: priority {job.priority} job takes GPUs from lower-priority jobs"
    cycle.commit_preemption(cand, taken, "priority", note)
    return True


def _could_end_within_fair_share(cycle: PoolCycle, cand: Candidate, acct: Account) -> bool:
    """Could the victims an in-project walk keeps free enough for the project to end within
    its fair share (the check after the walk)? An exact bound, worked out without walking.

    The victims kept are minimal (`spare_unneeded`: the candidate fits with them and, limit
    aside, no rule but fitting keeps one), so each kept victim's job frees a GPU that some
    placement of the candidate uses: else sparing that victim would leave the placement as it
    is. A placement uses at most `replicas` nodes, so the kept victims are jobs with a replica
    on one of those nodes, and free at most `replicas` times what such jobs can hold in all
    (`most_held_near_a_node`). At 4x the bench's size a project well over its fair share
    walked hundreds of victims (a gang waiting for whole nodes) to learn this, again for
    every shape: the part of the settled cycle that grew faster than the cluster.
    """
    must_free = acct.usage + cand.gpus - acct.fair_share
    if must_free <= 0:
        return True
    return must_free <= cand.replicas * cycle.most_held_near_a_node(cand.job.project)


def try_reclaim(cycle: PoolCycle, cand: Candidate) -> bool:  # noqa: PLR0911 (one return per rule)
    """Rule 5: take from preemptible jobs of other projects, only up to the claimant's fair
    share (and quota, for non-preemptible work), from projects above their threshold, one
    victim at a time from the project that would be served last without it."""
    job = cand.job
    ledger = cycle.ledger
    claimant = ledger.account(job.project)
    after = claimant.usage + cand.gpus
    if after > claimant.fair_share:
        return False
    if not job.preemptible and claimant.np_usage + cand.gpus > claimant.quota:
        return False
    within_quota = after <= claimant.quota
    # Only a project above its threshold gives GPUs, and what it holds only falls as victims
    # are taken: the projects at or below theirs can be left out from the start.
    held: dict[str, int] = {}
    for project in cycle.victim_jobs():
        if project != job.project:
            victim = ledger.account(project)
            if _may_give(victim, victim.usage, within_quota):
                held[project] = victim.usage
    if not held or not _could_free_enough(cycle, cand, held, within_quota):
        return False
    if not _reclaim_could_fit(cycle, cand, within_quota):
        return False

    # Each project's next victim and how late it would then be served, as last looked at:
    # it changes only when that project gives a victim (take_until_fits passes one Taken).
    offers: dict[str, tuple[ServedLastKey, Unit, list[Replica]] | None] = {}

    def offer(project: str, taken: Taken) -> tuple[ServedLastKey, Unit, list[Replica]] | None:
        victim = ledger.account(project)
        now_held = held[project]
        if not _may_give(victim, now_held, within_quota):
            return None
        found = cycle.next_unit(project, taken, job.node, _any)
        if found is None:
            return None
        unit, freed = found
        left = now_held - len(freed) * unit.job.gpus
        return (_served_last_key(victim, now_held, left), unit, freed)

    def pick(taken: Taken) -> tuple[Unit, list[Replica]] | None:
        best: tuple[ServedLastKey, Unit, list[Replica]] | None = None
        for project in held:
            if project not in offers:
                offers[project] = offer(project, taken)
            found = offers[project]
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None:
            return None
        _, unit, freed = best
        held[unit.project] -= len(freed) * unit.job.gpus
        del offers[unit.project]
        return unit, freed

    taken = cycle.take_until_fits(cand, pick)
    if taken is None and cycle.most_freed_generation != cycle.generation:
        # a walk found no fit: others may follow in this generation, bound them from now on
        cycle.most_freed.clear()
        cycle.most_freed_generation = cycle.generation
    if taken is None or not taken.units:
        return False
    if not within_quota and _a_victim_comes_back(cycle, taken):
        return False
    if not _claimant_goes_first(cycle, cand, taken):
        return False
    fair = claimant.fair_share
    note = (
        f"{job.project} holds {claimant.usage} of its fair share {fair} (quota {claimant.quota}); "
        + "; ".join(
            f"{p} held {ledger.account(p).usage}, fair share {ledger.account(p).fair_share}, "
            f"quota {ledger.account(p).quota}"
            for p in taken.freed_by_project
        )
    )
    cycle.commit_preemption(cand, taken, "reclaim", note)
    return True


def _threshold(victim: Account) -> int:
    """What a victim's project must hold more than to give GPUs: the larger of its quota and
    its fair share, each counted at most up to its limit."""
    return max(min(victim.quota, victim.limit), min(victim.fair_share, victim.limit))


def _may_give(victim: Account, now_held: int, claimant_within_quota: bool) -> bool:
    """Rule 5: before each victim is taken, its project holds more than its threshold, or the
    claimant is within its quota and the victim's project above its quota."""
    if now_held > _threshold(victim):
        return True
    return claimant_within_quota and now_held > min(victim.quota, victim.limit)


def _a_victim_comes_back(cycle: PoolCycle, taken: Taken) -> bool:
    """Rule 5, for a claimant above its quota: would the victims leave a project below its
    quota (counted at most up to its limit) while one of them would fit within that quota
    again? That project would take it straight back by the quota rule, and round it goes. A
    victim too large to come back within the quota may still be taken."""
    smallest: dict[str, int] = {}
    for unit, gpus in zip(taken.units, taken.gpus_freed, strict=True):
        smallest[unit.project] = min(gpus, smallest.get(unit.project, gpus))
    for project, freed in taken.freed_by_project.items():
        victim = cycle.ledger.account(project)
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
        victim = cycle.ledger.account(project)
        floor = min(victim.quota, victim.limit) if within_quota else _threshold(victim)
        if now_held > floor:
            room += min(now_held, now_held - floor + cycle.largest_unit_gpus(project))
        if room >= cand.gpus:
            return True
    return room >= cand.gpus


def _reclaim_could_fit(cycle: PoolCycle, cand: Candidate, within_quota: bool) -> bool:
    """Would an unpinned candidate fit if every project gave every victim a reclaim could
    take from it? If not, taking victims one by one (what `try_reclaim` does next) never
    makes it fit. (A pinned candidate is not bounded: its walk skips victims elsewhere, so
    it may go further down a project's victims than this walk does.)

    A failed reclaim walks every victim it may take, and at 4x the size there are 4x the
    claimants, each walking 4x the victims: that part of the settled cycle grew with the
    square of the size. The bound is worked out once per generation (decisions change it) and
    standing of the claimant (within its quota or not) for all claimants: each project gives
    its victims in order while `_may_give` lets it, so what any claimant's walk frees,
    whatever its project, is a subset of it. It costs a walk of everything any project may
    give, so it is worked out only once a walk has failed in this generation (`try_reclaim`
    marks it): where reclaims succeed (a burst of arrivals, each success a new generation),
    walks stop at the first fit and a bound per generation would cost more than it saves.
    """
    if cand.job.node is not None or cycle.most_freed_generation != cycle.generation:
        return True
    overlay = cycle.most_freed.get(within_quota)
    if overlay is None:
        overlay = cycle.most_freed[within_quota] = _most_reclaim_frees(cycle, within_quota)
    return cycle.capacity.fits(cand.job.gpus, cand.replicas, None, cand.ports, overlay)


def _most_reclaim_frees(cycle: PoolCycle, within_quota: bool) -> Overlay:
    """What every project giving every victim `_may_give` allows frees (with the GPUs being
    given back already), as `try_reclaim`'s walk counts it."""
    taken = cycle.new_taken()
    for project in cycle.victim_jobs():
        victim = cycle.ledger.account(project)
        now_held = victim.usage
        while _may_give(victim, now_held, within_quota):
            found = cycle.next_unit(project, taken, None, _any)
            if found is None:
                break
            unit, freed = found
            taken.add(unit, freed)
            now_held -= len(freed) * unit.job.gpus
    return taken.overlay


def _any(unit: Unit) -> bool:
    return True


ServedLastKey = tuple[bool, bool, int, float, int]


def _served_last_key(victim: Account, now_held: int, left: int) -> ServedLastKey:
    """How late the victim's project would be served if the victim were gone (`left` GPUs):
    over its fair share, then over its quota, then lower project priority, then the larger
    part of its fair share in use now (a fair share of 0 with GPUs held: infinitely over),
    then the newer project. Larger is later."""
    fair = victim.fair_share
    share = now_held / fair if fair else (float("inf") if now_held else 0.0)
    return (left > fair, left > victim.quota, -victim.priority, share, victim.order)


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
    ledger = cycle.ledger
    accounts = {
        p: replace(ledger.account(p), usage=ledger.account(p).usage - g)
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
            key=lambda p: project_key(accounts.get(p) or ledger.account(p), queues[p][0]),
        )
        c = queues[project].pop(0)
        if not queues[project]:
            del queues[project]
        if c is cand:
            return True
        acct = accounts.get(project) or ledger.account(project)
        if gate_ok(acct, c) and cycle.fits_with(c, taken):
            return False
    return True
