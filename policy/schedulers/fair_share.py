"""The default scheduler: quotas, fair shares, in-project preemption and reclaim (Run:AI's rules).

DESIGN.md, "Scheduling semantics", rules 2 to 7 and 9. Projects take turns; after every job the
project that was served is ranked again, so a project that got GPUs steps back behind those that
have less of their share.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import replace

from events import Replica
from policy.ledger import Account
from policy.pool_cycle import Candidate, PoolCycle, Taken, gate_ok
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


def job_key(cand: Candidate) -> tuple[int, int, int]:
    """Inside a project: minimums before extra replicas, then higher priority, then older."""
    return (1 if cand.extra else 0, -cand.job.priority, cand.job.seq)


#: A candidate queued after the start: job_key(cand) flattened, the order queued, the candidate
LaterItem = tuple[int, int, int, int, Candidate]


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
        extra, priority, seq, _, _ = self.later[0]
        return (extra, priority, seq) < job_key(self.items[self.at])

    def front(self) -> Candidate | None:
        if self.at < len(self.items):
            if self.later and self._later_first():
                return self.later[0][4]
            return self.items[self.at]
        return self.later[0][4] if self.later else None

    def take(self) -> Candidate | None:
        if self.at < len(self.items) and not (self.later and self._later_first()):
            self.at += 1
            return self.items[self.at - 1]
        return heapq.heappop(self.later)[4] if self.later else None

    def rank(self, front: Candidate) -> ProjectKey:
        """project_key(acct, front), which changes only with the usage and the request size."""
        gpus, usage = front.gpus, self.acct.usage
        if self.key is None or usage != self.key_usage or gpus != self.key_gpus:
            self.key = project_key(self.acct, front)
            self.key_usage, self.key_gpus = usage, gpus
        return self.key

    def remaining(self) -> list[Candidate]:
        return self.items[self.at :] + [item[4] for item in self.later]


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
    """Place what fits on idle GPUs (rules 2, 3 and 6). Returns the candidates left waiting."""
    maybe, waiting = cycle.split_by_room(cands)
    turns = Turns(cycle, maybe)
    no_fit: set[tuple[int, int, str | None]] = set()  # idle GPUs only shrink during this pass
    left: dict[tuple[int, int, str | None], int] = {}  # candidates still queued, by shape
    for queued in maybe:
        shape = queued.shape()
        left[shape] = left.get(shape, 0) + 1
    for cand in turns:
        shape = cand.shape()
        left[shape] -= 1
        acct = cycle.ledger.account(cand.job.project)
        placed = False
        if gate_ok(acct, cand) and shape not in no_fit:
            placed = cycle.try_place(cand)
            if not placed:
                no_fit.add(shape)
                if _nothing_fits(cycle, left, no_fit):
                    # no candidate left could be placed: they all wait (their order does not
                    # matter: the preemption pass orders them by its own keys)
                    waiting.append(cand)
                    waiting.extend(turns.remaining())
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


def _nothing_fits(
    cycle: PoolCycle,
    left: dict[tuple[int, int, str | None], int],
    no_fit: set[tuple[int, int, str | None]],
) -> bool:
    """Does no shape still queued fit the idle GPUs? (Shapes that do not are marked.)"""
    for shape, count in left.items():
        if count and shape not in no_fit:
            if cycle.capacity.fits(*shape):
                return False
            no_fit.add(shape)
    return True


def preempt(cycle: PoolCycle, waiting: list[Candidate]) -> None:
    """For jobs still waiting, in turn order: reclaim from other projects (rule 5), else take
    from lower-priority jobs of the same project (rule 4)."""
    turns = Turns(cycle, _may_preempt(cycle, waiting))
    failed: dict[tuple[object, ...], int] = {}
    for cand in turns:
        job = cand.job
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
        if failed.get(memo) != cycle.generation:
            if not (try_reclaim(cycle, cand) or try_preempt_in_project(cycle, cand)):
                failed[memo] = cycle.generation


def _may_preempt(cycle: PoolCycle, waiting: list[Candidate]) -> list[Candidate]:
    """The candidates past their preemption_delay that could reclaim (the project would stay
    within its fair share) or preempt in their project (lower-priority victims exist). Judged
    as the pass starts: a project whose standing changes during the pass is looked at again in
    the next cycle."""
    room: dict[str, int] = {}  # fair share less usage, per project
    lowest: dict[str, float] = {}  # the lowest priority of a possible victim, per project
    kept: list[Candidate] = []
    now = cycle.now
    for cand in waiting:
        job = cand.job
        if not (cand.extra or now - job.pending_since >= job.preemption_delay_s):
            continue  # cycle.delay_passed(cand), inline
        project = job.project
        left = room.get(project)
        if left is None:
            acct = cycle.ledger.account(project)
            left = room[project] = acct.fair_share - acct.usage
        if cand.replicas * job.gpus <= left:
            kept.append(cand)
            continue
        low = lowest.get(project)
        if low is None:
            low = lowest[project] = cycle.lowest_victim_priority(project)
        if low < job.priority:
            kept.append(cand)
    return kept


def try_preempt_in_project(cycle: PoolCycle, cand: Candidate) -> bool:
    job = cand.job
    acct = cycle.ledger.account(job.project)
    if not job.preemptible and acct.np_usage + cand.gpus > acct.quota:
        return False

    def lower(unit: Unit) -> bool:
        return unit.job.priority < job.priority

    taken = cycle.take_until_fits(cand, lambda t: cycle.next_unit(job.project, t, job.node, lower))
    if taken is None:
        return False
    freed = taken.freed_by_project.get(job.project, 0)
    if acct.usage - freed + cand.gpus > acct.limit:
        return False
    note = f"{job.project}: priority {job.priority} job takes GPUs from lower-priority jobs"
    cycle.commit_preemption(cand, taken, "priority", note)
    return True


def try_reclaim(cycle: PoolCycle, cand: Candidate) -> bool:
    job = cand.job
    ledger = cycle.ledger
    claimant = ledger.account(job.project)
    after = claimant.usage + cand.gpus
    if after > claimant.fair_share:
        return False
    if not job.preemptible and claimant.np_usage + cand.gpus > claimant.quota:
        return False
    within_quota = after <= claimant.quota
    others = [p for p in cycle.victim_jobs() if p != job.project]
    if not others:
        return False
    # Only a project above its threshold (may_take_from) gives GPUs, and what it holds only
    # falls as victims are taken: the projects at or below theirs can be left out from the start.
    held: dict[str, int] = {}
    accounts = ledger.accounts  # every project holding GPUs has an account
    for project in others:
        victim = accounts[project]
        threshold = victim.quota
        if not within_quota and victim.fair_share > threshold:
            threshold = victim.fair_share  # max(quota, fair_share)
        if victim.usage > threshold:
            held[project] = victim.usage
    if not _could_free_enough(cycle, cand, held, within_quota):
        return False

    def may_take_from(project: str) -> bool:
        victim = ledger.account(project)
        now_held = held[project]
        return now_held > max(victim.quota, victim.fair_share) or (
            within_quota and now_held > victim.quota
        )

    # Each project's next victim and how late it would then be served, as last looked at:
    # it changes only when that project gives a victim (take_until_fits passes one Taken).
    offers: dict[str, tuple[tuple[bool, bool, int, float, int], Unit, list[Replica]] | None]
    offers = {}

    def pick(taken: Taken) -> tuple[Unit, list[Replica]] | None:
        best: tuple[tuple[bool, bool, int, float, int], Unit, list[Replica]] | None = None
        for project, now_held in held.items():
            if project in offers:
                offer = offers[project]
            else:
                offer = None
                if may_take_from(project):
                    found = cycle.next_unit(project, taken, job.node, _any)
                    if found is not None:
                        unit, freed = found
                        left = now_held - len(freed) * unit.job.gpus
                        offer = (_served_last_key(ledger.account(project), left), unit, freed)
                offers[project] = offer
            if offer is not None and (best is None or offer[0] > best[0]):
                best = offer
        if best is None:
            return None
        _, unit, freed = best
        held[unit.project] -= len(freed) * unit.job.gpus
        del offers[unit.project]
        return unit, freed

    taken = cycle.take_until_fits(cand, pick)
    if taken is None:
        return False
    if after > claimant.fair_share:  # only reachable if the fair share check above is relaxed
        mine = after / max(claimant.fair_share, 1)
        for project in taken.freed_by_project:
            theirs = held[project] / max(ledger.account(project).fair_share, 1)
            if mine >= theirs:
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


def _could_free_enough(
    cycle: PoolCycle, cand: Candidate, held: dict[str, int], within_quota: bool
) -> bool:
    """A quick upper bound before looking at victims one by one: a project gives GPUs only
    while it holds more than its threshold, and its last victim overshoots by at most one unit."""
    job = cand.job
    room = cycle.capacity.free_on(job.node) if job.node else cycle.capacity.total_free
    for project, now_held in held.items():
        victim = cycle.ledger.account(project)
        threshold = victim.quota if within_quota else max(victim.quota, victim.fair_share)
        if now_held > threshold:
            room += min(now_held, now_held - threshold + cycle.largest_unit_gpus(project))
        if room >= cand.gpus:
            return True
    return room >= cand.gpus


def _any(unit: Unit) -> bool:
    return True


def _served_last_key(victim: Account, left: int) -> tuple[bool, bool, int, float, int]:
    """How late the victim's project would be served with `left` GPUs: larger is later."""
    share = left / victim.fair_share if victim.fair_share else (float("inf") if left else 0.0)
    return (left > victim.fair_share, left > victim.quota, -victim.priority, share, victim.order)


def _claimant_goes_first(cycle: PoolCycle, cand: Candidate, taken: Taken) -> bool:
    """Anti ping-pong: queue the victims again beside the claimant, with the GPUs they free;
    the claimant must be the first of them to be placed, or a victim would take its GPUs back."""
    requeued = [cand]
    for victim, replicas in taken.requests():
        if replicas:
            requeued.append(Candidate(victim, 1, extra=True, before=victim.min_replicas))
        else:
            requeued.append(Candidate(victim, victim.min_replicas))
    ledger = cycle.ledger
    # the victims' accounts as they would be once the victims have stopped
    freed_accounts = {
        p: replace(ledger.account(p), usage=ledger.account(p).usage - g)
        for p, g in taken.freed_by_project.items()
    }

    def as_if_freed(c: Candidate) -> Account:
        return freed_accounts.get(c.job.project) or ledger.account(c.job.project)

    ordered = sorted(requeued, key=lambda c: (project_key(as_if_freed(c), c), job_key(c)))
    for c in ordered:
        if c is cand:
            return True
        room = gate_ok(as_if_freed(c), c) and cycle.capacity.fits(
            c.job.gpus, c.replicas, c.job.node, taken.overlay
        )
        if room:
            return False
    return True


Scheduler = tuple[
    Callable[[PoolCycle, list[Candidate]], list[Candidate]],
    Callable[[PoolCycle, list[Candidate]], None],
]
