"""The default scheduler: quotas, fair shares, in-project preemption and reclaim (Run:AI's rules).

Rules 2 to 7 and 9 (docs/rules.md). Projects take turns; after every job the
project that was served is ranked again, so a project that got GPUs steps back behind those that
have less of their share.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from policy.accounts import Account
from policy.candidates import Candidate, JobKey, Shape, gate, gate_ok
from policy.pool_cycle import PoolCycle
from policy.schedulers.reclaim import try_reclaim
from policy.turns import ProjectKey, Turns, job_key, project_key
from policy.victim_search import NearWalk, Pick, Taken, next_unit, take_until_fits
from policy.victims import Unit


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
    turns = Turns(cycle.accounts, cands)
    placed: set[Candidate] = set()
    follow_ups: list[Candidate] = []
    no_fit: set[Shape] = set()  # idle GPUs only shrink during this pass
    for cand in turns:
        shape = cand.shape()
        left[shape] -= 1
        closed = gate(cycle.accounts.account(cand.job.project), cand)
        if closed is not None:
            cycle.waiting[cand.job.id] = closed
        elif shape in no_fit:
            cycle.waiting[cand.job.id] = "no_fit"
        elif cycle.try_place(cand):
            placed.add(cand)
            follow = cand.follow_up()
            if follow is not None:
                shape = follow.shape()
                left[shape] = left.get(shape, 0) + 1
                turns.queue(follow)
                follow_ups.append(follow)
        else:
            no_fit.add(shape)
            cycle.waiting[cand.job.id] = "no_fit"
            if _nothing_fits(cycle, left, no_fit):
                # no candidate left could be placed: they all wait (those that had their turn
                # were given a reason already, which wins over waiting for room)
                waiting = _left_waiting(cands, follow_ups, placed)
                cycle.wait_for_room(waiting)
                return waiting
    return _left_waiting(cands, follow_ups, placed)


def _left_waiting(
    cands: list[Candidate], follow_ups: list[Candidate], placed: set[Candidate]
) -> list[Candidate]:
    """The candidates not placed, in the order given, then the follow-ups queued: the order
    their objects lie in memory. The preemption pass puts them in its own turn order; read in
    this pass's turn order (each project's in turn, the projects interleaved), 36,000 of them
    at 4x the bench's size were read nine times slower than at 1x, a cache miss at each."""
    if not placed:
        return cands + follow_ups
    return [cand for cand in itertools.chain(cands, follow_ups) if cand not in placed]


def _first_turn_finds_no_fit(cycle: PoolCycle, fronts: dict[str, tuple[JobKey, Candidate]]) -> bool:
    """Is the first candidate `Turns` would give (the front of the project ranked first) one
    its gate lets through? If so it is marked `no_fit` (the caller knows nothing fits)."""
    first: tuple[tuple[ProjectKey, str], Candidate] | None = None
    for project, (_, cand) in fronts.items():
        entry = (project_key(cycle.accounts.account(project), cand), project)  # as the heap's
        if first is None or entry < first[0]:
            first = (entry, cand)
    if first is None or not gate_ok(cycle.accounts.account(first[1].job.project), first[1]):
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
    """For every job still waiting, in turn order: wait for releasing GPUs where they suffice
    (rule 7), else reclaim from other projects (rule 5), else take from lower-priority jobs of
    the same project (rule 4). A job still in its preemption_delay only waits for releasing
    GPUs: that preempts nobody, so the delay does not hold it back (rule 7).

    Every waiting job has its turn, also one that could do none of these as the pass starts
    (rule 2: a project is ranked with its next job, whatever that job may do). GPUs a reclaim
    frees beyond what its claimant needs are releasing from then on and go to the next job in
    turn order that fits them, and a project that gave victims may now reclaim. Left out of
    the turns as the pass started, such jobs let those GPUs go to a later project's job: in a
    cluster a random scenario found, that project then stood above its fair share, was
    reclaimed from, took the GPUs back, and the cycles never settled.

    Most waiting jobs can do nothing at their turn, and stay so until GPUs are releasing or
    their project's usage falls (`_Sleepers`): the turns pass over them in runs (`Turns`)."""
    sleepers = _Sleepers(cycle, waiting)
    turns = Turns(cycle.accounts, waiting, sleepers)
    failed: dict[tuple[object, ...], int] = {}
    for cand in turns:
        if cand in sleepers.delayed:
            if cycle.releasing and cycle.may_ask(cand):
                cycle.try_releasing(cand)
            continue
        # what a failure says nothing has changed for: same project, priority, preemptibility,
        # shape, kind of request (every candidate here is past its preemption_delay). Read
        # from the candidate, and asked first: most candidates end here, and their jobs
        # (elsewhere in memory, read by `may_ask`) missed the cache at scale
        memo = (
            cand.project,
            cand.priority,
            cand.preemptible,
            cand.job_gpus,
            cand.replicas,
            cand.node,
            cand.extra,
        )
        if failed.get(memo) == cycle.generation or not cycle.may_ask(cand):
            continue
        if cycle.try_releasing(cand):
            continue
        if not (try_reclaim(cycle, cand) or try_preempt_in_project(cycle, cand)):
            failed[memo] = cycle.generation


class _Sleepers:
    """Which waiting jobs could do something at their turn as the pass starts (`able`: reclaim,
    their project staying within its fair share, or preempt in their project, a victim of
    lower priority there), and whether the others still can't (`asleep`): those in their
    preemption_delay (they may only wait for releasing GPUs), and those that could do neither.

    They wake when GPUs are releasing, or when their project's usage falls below what it was
    as the pass started (it gave victims: it may reclaim). A project's victims only go during
    a pass, so the lowest priority among them only rises, and its fair share does not move."""

    __slots__ = ("_cycle", "_usage", "able", "delayed")

    def __init__(self, cycle: PoolCycle, waiting: list[Candidate]) -> None:
        self._cycle = cycle
        self._usage: dict[str, int] = {}  # per project, as the pass starts
        self.delayed: set[Candidate] = set()
        self.able: set[Candidate] = set()
        room: dict[str, int] = {}  # fair share less usage, per project
        lowest: dict[str, float] = {}  # the lowest priority of a possible victim, per project
        now = cycle.now
        # every job became pending at an event's time, at the latest the state's last: unless
        # the clock is behind the log, a job without a delay has waited long enough, and its
        # pending_since (a float elsewhere in memory) need not be read
        behind = now < cycle.state.last_time
        for cand in waiting:
            project = cand.project
            left = room.get(project)
            if left is None:
                acct = cycle.accounts.account(project)
                self._usage[project] = acct.usage
                left = room[project] = acct.fair_share - acct.usage
            delay = cand.delay  # cycle.delay_passed, inline
            if (delay or behind) and now - cand.job.pending_since < delay:
                cycle.waiting[cand.job.id] = "preemption_delay"
                self.delayed.add(cand)
                continue
            if cand.gpus <= left:
                self.able.add(cand)
                continue
            low = lowest.get(project)
            if low is None:
                low = lowest[project] = cycle.victims.lowest_priority(project)
            if low < cand.priority:
                self.able.add(cand)

    def asleep(self, project: str) -> bool:
        """Can the project's candidates that were not able still do nothing at their turn?"""
        cycle = self._cycle
        return not cycle.releasing and cycle.accounts.account(project).usage >= self._usage[project]


def try_preempt_in_project(cycle: PoolCycle, cand: Candidate) -> bool:
    """Rule 4: take from running preemptible jobs of the same project with strictly lower
    priority, only if the job then fits on the nodes and within the project's limit (a job
    held back only by the limit may preempt to get under it), a non-preemptible job within
    quota, and only if the project then holds no more than its fair share."""
    job = cand.job
    acct = cycle.accounts.account(job.project)
    if not job.preemptible and acct.np_usage + cand.gpus > acct.quota:
        return False
    if cycle.victims.lowest_priority(job.project) >= job.priority:
        # no victim of lower priority is left (the count may include units already taken,
        # never too few): looking would walk every unit of the project for nothing
        return False
    over_limit = acct.usage + cand.gpus - acct.limit  # what victims must free to get under it
    if over_limit <= 0 and not _could_end_within_fair_share(cycle, cand, acct):
        return False

    taken = _lower_priority_victims(cycle, cand, over_limit)
    if taken is None or not taken.units:
        return False
    if acct.usage - taken.freed_by_project.get(job.project, 0) + cand.gpus > acct.fair_share:
        return False  # a reclaim would undo it at once
    note = f"{job.project}: priority {job.priority} job takes GPUs from lower-priority jobs"
    cycle.commit_preemption(cand, taken, "priority", note)
    return True


def _lower_priority_victims(cycle: PoolCycle, cand: Candidate, over_limit: int) -> Taken | None:
    """Rule 4's walk: the project's units of lower priority, taken until the candidate fits
    (and frees `over_limit` GPUs of the project's, if above 0), the unneeded spared."""
    job = cand.job
    hopeful = _hopeful(cycle, cand) if over_limit <= 0 else None
    if hopeful is not None and not hopeful:
        return None  # no victims could make room for a replica anywhere

    def lower(unit: Unit) -> bool:
        return unit.job.priority < job.priority

    def under_limit(freed_by_project: Mapping[str, int]) -> bool:
        return freed_by_project.get(job.project, 0) >= over_limit

    pick: Pick
    if hopeful is None:
        pick = lambda t: next_unit(cycle, job.project, t, job.node, lower)  # noqa: E731
    else:
        walk, gone = NearWalk(cycle.victims, job.project, hopeful, job.priority), cycle.victims.gone
        pick = lambda t: walk.next(t, gone)  # noqa: E731
    return take_until_fits(cycle, cand, pick, under_limit if over_limit > 0 else None)


def _hopeful(cycle: PoolCycle, cand: Candidate) -> set[str] | None:
    """For replicas of several GPUs on no node in particular, publishing no ports: the nodes
    where the project's victims of lower priority could make room for one (None: not
    looked for). A victim whose job holds no replica on one of them frees GPUs only where no
    replica ever fits: it never makes the candidate fit, and sparing spares it whatever else
    is kept, so the walk passes over it without taking it (what a unit frees depends only on
    its own job's units taken before it, all passed over alike). Only where nothing but
    fitting keeps a victim (no limit to get under: there any GPU freed counts). At 4x the
    bench's size a job waiting for a whole node took ~80 victims a walk, most of them on
    nodes that could never be freed."""
    job = cand.job
    if job.node is not None or cand.ports or job.gpus <= 1:
        return None
    gpus, by_name, releasing = job.gpus, cycle.capacity.by_name, cycle.releasing
    held_below = cycle.victims.held_below(job.project, job.priority)
    if cycle.capacity.total_free == 0:
        # no idle GPU (the pool is full when jobs preempt): the nodes where the victims alone
        # make room, and those where GPUs given back add to them, without looking at every
        # node they are on (hundreds at 4x the bench's size, for each walk)
        at_least = cycle.victims.held_at_least(job.project, job.priority, gpus)
        hopeful = {n for n in at_least if n in by_name}
        for node, back in releasing.items():
            if node in by_name and len(back) + held_below.get(node, 0) >= gpus:
                hopeful.add(node)
        return hopeful
    hopeful = set()
    for node, held in held_below.items():
        slot = by_name.get(node)
        if slot is not None and len(slot.free) + len(releasing.get(node, ())) + held >= gpus:
            hopeful.add(node)
    return hopeful


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
    return must_free <= cand.replicas * cycle.victims.most_held_near_a_node(cand.job.project)
