"""One pool's share of a scheduling cycle: its idle GPUs, its ledger, and the decisions made.

The schedulers (fair_share, priority, round_robin) decide *what*; this module carries out the
mechanics they share: placing a candidate, taking victims until a job fits, and turning both
into events with ids derived from their inputs (a restarted scheduler that decides the same
thing again publishes the same ids, which the log drops as duplicates).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from events import (
    Event,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    PreemptionFacts,
    Replica,
    SchedulerSettings,
)
from events.catalogue import PreemptionReason
from policy.capacity import Capacity, Overlay, OverlayFit
from policy.ledger import Account, Ledger
from policy.state import ClusterState, Job
from policy.victims import Unit, lost_work_gpu_s, may_be_victim, units_of

ACTOR = "scheduler"
#: Preemption decisions (nominations and the stop requests they cause) carry their own actor.
PREEMPTOR = "preemptor"

#: Why a job is still waiting after a cycle (the API's "why is my job pending"):
#: no_fit: not enough idle GPUs of the right shape (and nobody it may preempt);
#: limit: its project's limit; quota: non-preemptible work only runs within quota;
#: preemption_delay: it may not preempt anyone yet; held: scheduling is held by an operator;
#: nominated: GPUs are held for it while others give them back; no_pool: no pool of its list
#: could hold it with its nodes as they are now.
WaitReason = Literal["no_fit", "limit", "quota", "preemption_delay", "held", "nominated", "no_pool"]
#: What placing a request looks at: GPUs per replica, replicas, the pinned node, host ports.
Shape = tuple[int, int, str | None, tuple[int, ...]]


class Candidate:
    """A request for GPUs: a pending job's minimum gang, or one more replica of an elastic job.

    It keeps a copy of what the passes over every candidate read of its job (project,
    priority, size, node, preemption delay): made one after the other, candidates lie side by
    side in memory, while each job lies where it was made; at 40,000 candidates reading the
    jobs again in every pass missed the processor's cache."""

    __slots__ = (
        "before",
        "delay",
        "extra",
        "gpus",
        "job",
        "job_gpus",
        "node",
        "ports",
        "priority",
        "project",
        "replicas",
    )

    def __init__(self, job: Job, replicas: int, extra: bool = False, before: int = 0) -> None:
        self.job = job
        self.replicas = replicas
        self.extra = extra
        self.before = before  # replicas the job holds (or is given this cycle) before this
        self.project = job.project
        self.priority = job.priority
        self.job_gpus = job.gpus
        self.gpus = replicas * job.gpus
        self.node = job.node
        self.delay = job.preemption_delay_s
        spec = job.spec
        self.ports = spec.host_ports() if spec.ports else ()  # (no call for most jobs)

    def __repr__(self) -> str:
        return f"Candidate({self.job.id!r}, {self.replicas}, extra={self.extra})"

    def shape(self) -> Shape:
        return (self.job_gpus, self.replicas, self.node, self.ports)

    def follow_up(self) -> Candidate | None:
        """Once this is placed, an elastic job's next replica waits its turn (rule 6)."""
        after = self.before + self.replicas
        if self.job.elastic and after < self.job.replicas:
            return Candidate(self.job, 1, extra=True, before=after)
        return None


@dataclass(slots=True)
class Taken:
    """Victims chosen so far for one candidate, and what they free. The overlay starts with
    the GPUs stopping jobs are giving back (rule 7: they count as free)."""

    #: surplus replicas of each job already taken by earlier preemptions of this cycle
    base_surplus: dict[str, int]
    #: units taken by earlier preemptions of this cycle
    base_used: set[int]
    overlay: dict[str, list[int]]
    units: list[Unit] = field(default_factory=list)
    gpus_freed: list[int] = field(default_factory=list)  # by each of `units`, in order
    freed_by_project: dict[str, int] = field(default_factory=dict)
    surplus_taken: dict[str, int] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)  # where a picker stopped looking
    used: set[int] = field(default_factory=set)

    def replicas_freed(self, unit: Unit) -> list[Replica]:
        job = unit.job
        if id(unit) in self.used or id(unit) in self.base_used:
            return []
        active = job.active_replicas - self.base_surplus.get(job.id, 0)
        active -= self.surplus_taken.get(job.id, 0)
        if unit.surplus:
            if active <= job.min_replicas:
                return []
            return [job.held[active - 1]]
        return job.held[:active]

    def add(self, unit: Unit, replicas: list[Replica]) -> int:
        self.units.append(unit)
        self.used.add(id(unit))
        for r in replicas:
            freed = self.overlay.setdefault(r.node, [])
            freed.extend(g for g in r.gpus if g not in freed)
        gpus = len(replicas) * unit.job.gpus
        self.gpus_freed.append(gpus)
        self.freed_by_project[unit.project] = self.freed_by_project.get(unit.project, 0) + gpus
        if unit.surplus:
            self.surplus_taken[unit.job.id] = self.surplus_taken.get(unit.job.id, 0) + 1
        return gpus

    def requests(self) -> list[tuple[Job, int]]:
        """(job, replicas to stop; 0 for the whole job), one per victim job, in taking order."""
        seen: dict[str, tuple[Job, int]] = {}
        for unit in self.units:
            job = unit.job
            if unit.surplus and seen.get(job.id, (job, 1))[1] != 0:
                seen[job.id] = (job, self.surplus_taken[job.id])
            else:
                seen[job.id] = (job, 0)
        return list(seen.values())


#: A rule a set of victims must satisfy besides making room, given the GPUs they free per project
Enough = Callable[[Mapping[str, int]], bool]


class PoolCycle:
    def __init__(  # noqa: PLR0913 (a cycle is made from all of these)
        self,
        state: ClusterState,
        pool: str,
        settings: SchedulerSettings,
        capacity: Capacity,
        ledger: Ledger,
        now: float,
        out: list[Event],
        releasing: dict[str, list[int]] | None = None,
        waiting: dict[str, WaitReason] | None = None,
        waiting_for_room: list[Sequence[Candidate]] | None = None,
    ) -> None:
        self.state = state
        self.pool = pool
        self.settings = settings
        self.capacity = capacity
        self.ledger = ledger
        self.now = now
        self.out = out
        self.basis_seq = state.position
        #: GPUs being given back (stopping jobs, and what this cycle's victims free beyond the
        #: job they were taken for), not held for anyone: rule 7 counts them as free when
        #: deciding whether anyone must be preempted
        self.releasing: dict[str, list[int]] = releasing if releasing is not None else {}
        #: why each job left waiting waits (the last reason found for it this cycle)
        self.waiting: dict[str, WaitReason] = waiting if waiting is not None else {}
        #: candidates left waiting for room unless a reason is given for them (`wait_for_room`)
        self.waiting_for_room = waiting_for_room if waiting_for_room is not None else []
        #: surplus replicas each job gives up this cycle, and the victim units already taken
        self.surplus_stopped: dict[str, int] = {}
        self.used_units: set[int] = set()
        self.running: list[Job] = []  # filled by the cycle: jobs holding GPUs in this pool
        self.generation = 0  # bumps on every decision, invalidating memos of failures
        # Decisions of this cycle, kept here rather than written into the state (which is input)
        self.stopping: set[str] = set()
        self.nominated: set[str] = set()
        self.gone: set[str] = set()  # stopping, nominated or grown this cycle: no victim
        # Possible victims, found once per cycle; their units are sorted per project when first
        # needed. Lists of units keep those of jobs gone since: skip them (all units before
        # _start[project] are gone).
        self._victim_jobs: dict[str, list[Job]] | None = None
        self._victims: list[Job] = []  # the same, in submission order
        self._units: dict[str, list[Unit]] = {}
        self._start: dict[str, int] = {}
        self._pool_units: list[Unit] | None = None
        self._pool_start = 0
        # per project (once asked): how many live units free so many GPUs / have a priority
        self._sizes: dict[str, dict[int, int]] = {}
        self._priorities: dict[str, dict[int, int]] = {}
        #: per project: what its victims on several nodes hold beyond one replica each
        self._spread: dict[str, int] = {}
        self._most_held_on_a_node: int | None = None
        #: a scheduler's bound on what preempting could free (fair_share's
        #: _reclaim_could_fit), and the generation it was worked out in
        self.most_freed: dict[bool, Overlay] = {}
        self.most_freed_generation = -1

    def wait_for_room(self, cands: Sequence[Candidate]) -> None:
        """These candidates wait for room (`no_fit`) unless a reason is given for them in this
        cycle, before or after. Named only when the plan's `waiting` is read; the list must
        not change after."""
        self.waiting_for_room.append(cands)

    # -- placing ---------------------------------------------------------------------------------

    def try_place(self, cand: Candidate) -> bool:
        placed = self.capacity.place(
            cand.job.gpus, cand.replicas, self.settings.fitting, cand.job.node, cand.ports
        )
        if placed is None:
            return False
        self.schedule(cand, placed)
        return True

    def split_by_room(self, cands: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """Candidates that might fit the idle GPUs now, and those that cannot. Idle GPUs only
        shrink while a pass hands them out, so the second list needs no further look."""
        memo: dict[Shape, bool] = {}
        maybe: list[Candidate] = []
        never: list[Candidate] = []
        for cand in cands:
            shape = cand.shape()
            ok = memo.get(shape)
            if ok is None:
                ok = memo[shape] = self.capacity.fits(*shape)
            if ok:
                maybe.append(cand)
            else:
                self.waiting[cand.job.id] = "no_fit"
                never.append(cand)
        return maybe, never

    def schedule(self, cand: Candidate, replicas: list[Replica], note: str = "") -> None:
        job = cand.job
        self.ledger.account(job.project).add(cand.gpus, job.preemptible)
        if cand.extra:
            # an extra replica joins the attempt its minimum started (maybe in this very cycle)
            attempt = job.attempt if job.phase in ("starting", "running") else job.attempt + 1
            count = cand.before + len(replicas)
            # surplus replicas may be taken back and granted again within one attempt: the
            # preemption count keeps the id of a later grant apart from an earlier one
            event_id = f"{job.id}/{attempt}/scale/{count}-{job.preemptions}"
            self.out.append(
                JobScheduled(
                    id=event_id,
                    time=self.now,
                    actor=ACTOR,
                    job_id=job.id,
                    attempt=attempt,
                    pool=self.pool,
                    replicas=tuple(replicas),
                    scale_up=True,
                    note=note,
                    basis_seq=self.basis_seq,
                    history=self.ledger.history_of((job.project,)),
                )
            )
            # what this cycle gives a job, it does not take back in the same breath: a job
            # that grows now is no victim until the next cycle (its new replica would not even
            # count as surplus, and preempting it whole undoes the grant at once)
            self._forget_units([job])
            return
        attempt = job.attempt + 1
        self.out.append(
            JobScheduled(
                id=f"{job.id}/{attempt}/scheduled",
                time=self.now,
                actor=ACTOR,
                job_id=job.id,
                attempt=attempt,
                pool=self.pool,
                replicas=tuple(replicas),
                note=note,
                basis_seq=self.basis_seq,
                history=self.ledger.history_of((job.project,)),
            )
        )
        self.generation += 1

    # -- victims ---------------------------------------------------------------------------------

    def victim_jobs(self) -> dict[str, list[Job]]:
        """Jobs of this pool that may be victims, per project (found once per cycle; those gone
        since are still listed)."""
        if self._victim_jobs is None:
            by_project: dict[str, list[Job]] = {}
            gone, now = self.gone, self.now
            for job in self.running:
                # `gone` is mostly empty here: asked first, it spares reading every job's id
                if may_be_victim(job, now) and (not gone or job.id not in gone):
                    by_project.setdefault(job.project, []).append(job)
                    self._victims.append(job)
            self._victim_jobs = by_project
        return self._victim_jobs

    def project_units(self, project: str) -> list[Unit]:
        """The project's victim units in taking order (units of jobs gone since included)."""
        units = self._units.get(project)
        if units is None:
            gone = self.gone
            jobs = self.victim_jobs().get(project, [])
            if gone:
                jobs = [j for j in jobs if j.id not in gone]
            units = self._units[project] = units_of(jobs, self.settings.victim_order, self.now)
        return units

    def pool_units(self) -> tuple[list[Unit], int]:
        """All victim units of the pool, whatever their project, in taking order (units of jobs
        gone since included), and where the first that may not be gone is."""
        if self._pool_units is None:
            self.victim_jobs()
            gone = self.gone
            jobs = [j for j in self._victims if j.id not in gone] if gone else self._victims
            self._pool_units = units_of(jobs, self.settings.victim_order, self.now)
        units, i = self._pool_units, self._pool_start
        while i < len(units) and units[i].job.id in self.gone:
            i += 1
        self._pool_start = i
        return units, i

    def units_by_project(self) -> dict[str, list[Unit]]:
        """Victim units of this pool per project, in taking order, without those gone."""
        gone = self.gone
        return {
            p: [u for u in self.project_units(p) if u.job.id not in gone]
            for p in self.victim_jobs()
        }

    def _unit_counts(self, project: str) -> tuple[dict[int, int], dict[int, int]]:
        sizes = self._sizes.get(project)
        priorities = self._priorities.get(project)
        if sizes is None or priorities is None:
            sizes = self._sizes[project] = {}
            priorities = self._priorities[project] = {}
            spread = 0
            gone = self.gone
            for job in self.victim_jobs().get(project, ()):
                if gone and job.id in gone:  # mostly empty: spares reading every job's id
                    continue
                # _count_units(job, sizes, priorities, 1), inline: this runs for many jobs
                held = job.held
                if len(held) > 1 and any(r.node != held[0].node for r in held):
                    spread += job.gpus * (len(held) - 1)
                surplus = len(held) - job.stop_replicas - job.min_replicas
                if surplus > 0:
                    sizes[job.gpus] = sizes.get(job.gpus, 0) + surplus
                whole = job.gpus * (len(job.held) - job.stop_replicas)
                sizes[whole] = sizes.get(whole, 0) + 1
                priority = job.priority
                priorities[priority] = priorities.get(priority, 0) + 1 + max(0, surplus)
            self._spread[project] = spread
        return sizes, priorities

    def largest_unit_gpus(self, project: str) -> int:
        """The most GPUs one victim unit of the project frees (0 if it has none)."""
        sizes, _ = self._unit_counts(project)
        return max((g for g, n in sizes.items() if n), default=0)

    def lowest_victim_priority(self, project: str) -> float:
        """The lowest job priority among the project's possible victims (inf if none)."""
        _, priorities = self._unit_counts(project)
        return min((p for p, n in priorities.items() if n), default=float("inf"))

    def most_held_near_a_node(self, project: str) -> int:
        """At least the GPUs that the project's possible victims with a replica on any one
        node hold in all (there and elsewhere), for every node of the pool: what is held on
        the fullest node (of any pool), plus what the victims spread over several nodes hold
        beyond one replica each. Victims gone since only make it smaller: it stays an upper
        bound."""
        if self._most_held_on_a_node is None:
            self._most_held_on_a_node = max(map(len, self.state.owners.values()), default=0)
        self._unit_counts(project)  # works out the project's _spread with its unit counts
        return self._most_held_on_a_node + self._spread[project]

    def _forget_units(self, jobs: list[Job]) -> None:
        """These jobs are now stopping, nominated or given GPUs: victims no more this cycle."""
        for job in jobs:
            if job.id in self.gone:
                continue
            self.gone.add(job.id)
            sizes = self._sizes.get(job.project)
            priorities = self._priorities.get(job.project)
            # counted then if it may be a victim (a job gone before was skipped above)
            if sizes is not None and priorities is not None and may_be_victim(job, self.now):
                _count_units(job, sizes, priorities, -1)

    def next_unit(
        self, project: str, taken: Taken, pin: str | None, admit: Callable[[Unit], bool]
    ) -> tuple[Unit, list[Replica]] | None:
        """The next unit of `project` that `admit` accepts and that frees GPUs the candidate
        could use, without taking it."""
        units = self.project_units(project)
        gone = self.gone
        i = taken.cursor.get(project)
        if i is None:
            i = self._start.get(project, 0)
            while i < len(units) and units[i].job.id in gone:
                i += 1
            self._start[project] = i
        while i < len(units):
            unit = units[i]
            if unit.job.id not in gone:
                freed = taken.replicas_freed(unit) if admit(unit) else []
                if freed and (pin is None or any(r.node == pin for r in freed)):
                    taken.cursor[project] = i
                    return unit, freed
            i += 1
        taken.cursor[project] = i
        return None

    def new_taken(self) -> Taken:
        overlay = {node: list(gpus) for node, gpus in self.releasing.items() if gpus}
        return Taken(self.surplus_stopped, self.used_units, overlay)

    def fits_with(self, cand: Candidate, taken: Taken) -> bool:
        job = cand.job
        return self.capacity.fits(job.gpus, cand.replicas, job.node, cand.ports, taken.overlay)

    def take_until_fits(
        self,
        cand: Candidate,
        pick: Callable[[Taken], tuple[Unit, list[Replica]] | None],
        enough: Enough | None = None,
    ) -> Taken | None:
        """Take victims one at a time (`pick` chooses the next) until the candidate fits (and
        `enough` holds), then spare every victim the candidate can do without (rule 5: only
        as many as needed). None if it never fits: then nobody is preempted."""
        taken = self.new_taken()
        fit = self.overlay_fit(cand, taken.overlay)  # asked after every victim: kept up to date
        while not (fit.fits() and (enough is None or enough(taken.freed_by_project))):
            chosen = pick(taken)
            if chosen is None:
                return None
            taken.add(*chosen)
            for r in chosen[1]:
                fit.resize(r.node, len(taken.overlay[r.node]))
        return self.spare_unneeded(cand, taken, enough)

    def overlay_fit(self, cand: Candidate, overlay: Overlay) -> OverlayFit:
        job = cand.job
        return OverlayFit(self.capacity, job.gpus, cand.replicas, job.node, overlay, cand.ports)

    def spare_unneeded(self, cand: Candidate, taken: Taken, enough: Enough | None) -> Taken:
        """Go through the victims in the order they were taken and spare each one the candidate
        can do without: it still fits, and every rule (`enough`) still holds. (What the
        victims left free is worked out as if they had been taken afresh, in this order.)"""
        if len(taken.units) < 2 and (not taken.units or not self._fits_bare(cand, enough)):
            return taken
        alone = self._last_alone(cand, taken, enough)
        if alone is not None:
            return alone
        kept = _KeptVictims(self, cand, taken)
        for unit in taken.units:
            kept.spare_if_unneeded(unit, enough)
        spared = kept.units()
        return self._taken_of(spared) if len(spared) < len(taken.units) else taken

    def _last_alone(self, cand: Candidate, taken: Taken, enough: Enough | None) -> Taken | None:
        """The last victim taken, alone, if it makes room by itself (and every rule holds) and
        no other victim is of its job: then sparing one by one spares every victim before it
        (what is left always holds the last one, whose GPUs do not depend on victims of other
        jobs, and more freed GPUs never fit worse) and keeps the last (the candidate did not
        fit before it was taken). Found without sparing victim by victim: a gang waiting for a
        whole node often takes hundreds of small victims before one frees the node."""
        last = taken.units[-1]
        if any(u.job.id == last.job.id for u in taken.units[:-1]):
            return None
        alone = self._taken_of([last])
        if not self.fits_with(cand, alone):
            return None
        if enough is not None and not enough(alone.freed_by_project):
            return None
        return alone

    def _fits_bare(self, cand: Candidate, enough: Enough | None) -> bool:
        bare = self.new_taken()
        return self.fits_with(cand, bare) and (enough is None or enough(bare.freed_by_project))

    def _taken_of(self, units: list[Unit]) -> Taken:
        """These victims taken afresh, in this order (what each frees is worked out again)."""
        taken = self.new_taken()
        for unit in units:
            freed = taken.replicas_freed(unit)
            if freed:
                taken.add(unit, freed)
        return taken

    def commit_preemption(
        self, cand: Candidate, taken: Taken, reason: PreemptionReason, note: str
    ) -> None:
        """Hold GPUs (idle, releasing and the victims') for `cand`, then ask the victims to
        stop. The nomination goes first: the fold applies a victim's stop only if the
        nomination it serves was applied."""
        job = cand.job
        involved = {job.project} | {u.project for u in taken.units}
        # the ledger as it stands before this preemption, for the projects it involves
        fair_share, usage, quota = self.ledger.facts(involved)
        requests = taken.requests()
        nomination = self.nominate(cand, taken.overlay, tuple(v.id for v, _ in requests), reason)
        for victim, replicas in requests:
            count = replicas or victim.active_replicas - self.surplus_stopped.get(victim.id, 0)
            gpus = count * victim.gpus
            self.ledger.account(victim.project).remove(gpus, victim.preemptible)
            if replicas:
                self.surplus_stopped[victim.id] = self.surplus_stopped.get(victim.id, 0) + count
            else:
                self.stopping.add(victim.id)
                self._forget_units([victim])
            if victim.lost_node:
                continue  # this cycle asks it to stop already (node_lost): ask once
            facts = PreemptionFacts(
                pool=self.pool,
                fair_share=dict(fair_share),
                usage=dict(usage),
                quota=dict(quota),
                victim_gpus=gpus,
                cost_gpu_s=round(lost_work_gpu_s(victim, self.now, count), 3),
                note=note,
                history=self.ledger.history_of(involved),
            )
            remaining = len(victim.held) - (replicas or len(victim.held))
            if replicas:
                remaining = victim.active_replicas - self.surplus_stopped[victim.id]
            self.out.append(
                JobPreemptionRequested(
                    # the preemption count keeps a later stop of as many replicas (surplus taken
                    # back, granted again, taken back again) apart from an earlier one
                    id=f"{victim.id}/{victim.attempt}/preempt/{remaining}-{victim.preemptions}",
                    time=self.now,
                    actor=PREEMPTOR,
                    causation=nomination.id,
                    job_id=victim.id,
                    attempt=victim.attempt,
                    reason=reason,
                    replicas=replicas,
                    for_job=job.id,
                    facts=facts,
                    basis_seq=self.basis_seq,
                )
            )
        self.used_units.update(id(u) for u in taken.units)
        self.generation += 1

    def nominate(
        self,
        cand: Candidate,
        overlay: dict[str, list[int]],
        victims: tuple[str, ...],
        reason: PreemptionReason,
    ) -> JobNominated:
        """Hold GPUs for `cand` from the idle ones and `overlay` (releasing and freed GPUs);
        what the overlay holds beyond its need is releasing for the rest of the cycle."""
        job = cand.job
        placed = self.capacity.place(
            job.gpus, cand.replicas, self.settings.fitting, job.node, cand.ports, overlay
        )
        assert placed is not None, "the caller made sure it fits"
        self.releasing = _left_over(overlay, placed)
        self.ledger.account(job.project).add(cand.gpus, job.preemptible)
        nomination = JobNominated(
            id=f"{job.id}/nominate/{job.nominations + 1}",
            time=self.now,
            actor=PREEMPTOR,
            job_id=job.id,
            pool=self.pool,
            replicas=tuple(placed),
            victims=victims,
            reason=reason,
            basis_seq=self.basis_seq,
            history=self.ledger.history_of(self._involved(job, victims)),
        )
        self.out.append(nomination)
        self.nominated.add(job.id)
        self.waiting[job.id] = "nominated"
        self._forget_units([job])
        self.generation += 1
        return nomination

    def _involved(self, job: Job, victims: tuple[str, ...]) -> set[str]:
        """The projects a nomination involves: the nominee's and its victims'."""
        return {job.project, *(self.state.jobs[v].project for v in victims if v in self.state.jobs)}

    def try_releasing(self, cand: Candidate) -> bool:
        """Rule 7: a job that fits in idle plus releasing GPUs waits for them, nominated, and
        preempts nobody."""
        if not self.releasing or not gate_ok(self.ledger.account(cand.job.project), cand):
            return False
        taken = self.new_taken()
        if not self.fits_with(cand, taken):
            return False
        self.nominate(cand, taken.overlay, (), "priority" if cand.job.preemptible else "reclaim")
        return True

    def may_ask(self, cand: Candidate) -> bool:
        """A job that gave up GPUs this cycle, or was just granted some, asks for no more in
        the same breath (a victim taking its GPUs straight back would be ping-pong)."""
        job_id = cand.job.id
        return not (
            job_id in self.stopping or job_id in self.nominated or job_id in self.surplus_stopped
        )

    def delay_passed(self, cand: Candidate) -> bool:
        """Rule 7: the delay holds for the whole job, its extra replicas included."""
        job = cand.job
        return self.now - job.pending_since >= job.preemption_delay_s


class _KeptVictims:
    """The victims kept while sparing (`PoolCycle.spare_unneeded`), what they free and whether
    the candidate fits, changed one victim at a time.

    Sparing asks, for each victim in turn, whether the candidate still fits without it. Taking
    every kept victim afresh for each question cost k^2 for k victims, and k grows with the
    pool (a gang waiting for whole nodes takes hundreds of small victims at 4x the bench's
    size). A victim's going changes what only its own job's other units free (a surplus
    replica frees the job's newest replica not yet taken), so only that job is worked out
    again, with `Taken`'s own rules, and the fit follows the nodes that changed.
    """

    def __init__(self, cycle: PoolCycle, cand: Candidate, taken: Taken) -> None:
        self._order = taken.units
        self._base = (taken.base_surplus, taken.base_used)
        releasing = cycle.new_taken().overlay
        self._fit = cycle.overlay_fit(cand, releasing)
        # the overlay per node: the releasing GPUs, plus each GPU a kept victim frees, counted
        # once however many free it (as Taken.add counts it)
        self._releasing = {node: set(gpus) for node, gpus in releasing.items()}
        self._releasing_len = {node: len(gpus) for node, gpus in releasing.items()}
        self._freeing: dict[str, dict[int, int]] = {}  # node -> GPU -> kept victims freeing it
        self._new: dict[str, int] = {}  # node -> GPUs freed that are not releasing anyway
        self.freed_by_project: dict[str, int] = {}
        self._freed: dict[int, list[Replica]] = {}  # id(unit) -> what it frees now
        self._jobs: dict[str, list[Unit]] = {}  # each job's kept units, in taking order
        for unit in taken.units:
            self._jobs.setdefault(unit.job.id, []).append(unit)
        for units in list(self._jobs.values()):
            self._set_job(units[0].job, units)

    def spare_if_unneeded(self, unit: Unit, enough: Enough | None) -> None:
        job = unit.job
        before = self._jobs.get(job.id, [])
        if not any(u is unit for u in before):
            return  # left already (it freed nothing once an earlier unit of its job went)
        if len(before) == 1:
            # most victims are their job's only unit: nothing else to work out again
            freed = self._freed[id(unit)]
            self._free(unit, freed, -1)
            if self._fit.fits() and (enough is None or enough(self.freed_by_project)):
                self._jobs[job.id], self._freed[id(unit)] = [], []
            else:
                self._free(unit, freed, 1)
            return
        self._set_job(job, [u for u in before if u is not unit])
        if self._fit.fits() and (enough is None or enough(self.freed_by_project)):
            # spared; units of its job that now free nothing leave too (_taken_of drops them)
            self._jobs[job.id] = [u for u in self._jobs[job.id] if self._freed[id(u)]]
        else:
            self._set_job(job, before)

    def units(self) -> list[Unit]:
        """The victims kept, in taking order."""
        kept = {id(u) for units in self._jobs.values() for u in units}
        return [u for u in self._order if id(u) in kept]

    def _set_job(self, job: Job, units: list[Unit]) -> None:
        """Keep these units of the job (in taking order) instead of those kept so far."""
        for unit in self._jobs.get(job.id, ()):
            self._free(unit, self._freed.pop(id(unit), []), -1)
        # what a job's units free depends on none of the other jobs' units
        alone = Taken(*self._base, overlay={})
        for unit in units:
            freed = alone.replicas_freed(unit)
            if freed:
                alone.add(unit, freed)
            self._freed[id(unit)] = freed
            self._free(unit, freed, 1)
        self._jobs[job.id] = units

    def _free(self, unit: Unit, replicas: list[Replica], sign: int) -> None:
        if not replicas:
            return
        gpus = len(replicas) * unit.job.gpus
        self.freed_by_project[unit.project] = self.freed_by_project.get(unit.project, 0) + (
            sign * gpus
        )
        for r in replicas:
            counts = self._freeing.setdefault(r.node, {})
            releasing = self._releasing.get(r.node, set())
            new = self._new.get(r.node, 0)
            for g in r.gpus:
                n = counts.get(g, 0) + sign
                counts[g] = n
                if g not in releasing and n == (1 if sign > 0 else 0):
                    new += sign  # the first to free it, or the last one gone
            self._new[r.node] = new
            self._fit.resize(r.node, self._releasing_len.get(r.node, 0) + new)


def _count_units(job: Job, sizes: dict[int, int], priorities: dict[int, int], sign: int) -> None:
    """Add (or with sign -1 remove) the job's victim units: each surplus replica, the whole."""
    surplus = max(0, job.active_replicas - job.min_replicas)
    sizes[job.gpus] = sizes.get(job.gpus, 0) + sign * surplus
    whole = job.gpus * job.active_replicas
    sizes[whole] = sizes.get(whole, 0) + sign
    priorities[job.priority] = priorities.get(job.priority, 0) + sign * (surplus + 1)


def gate(acct: Account, cand: Candidate, respect_quota: bool = True) -> WaitReason | None:
    """Rule 3: preemptible work may use idle GPUs up to the limit; non-preemptible work only
    while the project's non-preemptible usage stays within its quota. None: the gate is open."""
    if acct.usage + cand.gpus > acct.limit:
        return "limit"
    if respect_quota and not cand.job.preemptible and acct.np_usage + cand.gpus > acct.quota:
        return "quota"
    return None


def gate_ok(acct: Account, cand: Candidate, respect_quota: bool = True) -> bool:
    return gate(acct, cand, respect_quota) is None


def _left_over(overlay: dict[str, list[int]], placed: list[Replica]) -> dict[str, list[int]]:
    """The overlay's GPUs that `placed` does not use."""
    used: dict[str, set[int]] = {}
    for r in placed:
        used.setdefault(r.node, set()).update(r.gpus)
    left: dict[str, list[int]] = {}
    for node, gpus in overlay.items():
        taken = used.get(node)
        rest = [g for g in gpus if g not in taken] if taken else list(gpus)
        if rest:
            left[node] = rest
    return left
