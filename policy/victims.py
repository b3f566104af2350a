"""Who may be preempted, in what order, and what it would cost.

A victim unit is either one surplus replica of an elastic job (above its minimum), or a whole
job. Among units, lower job priority goes first; among equal priority, surplus replicas go
before whole jobs (an elastic job loses its extras before anything else, rule 6); then the
newest job, or with `victim_order: cost` the one that would lose the least work (rule 9).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from events.model import VictimOrder
from policy.state import Job


@dataclass(slots=True)
class Unit:
    job: Job
    surplus: bool  # one replica above the minimum, or the whole job

    @property
    def project(self) -> str:
        return self.job.project


def lost_work_gpu_s(job: Job, now: float, replicas: int | None = None) -> float:
    """GPU-seconds lost by stopping `replicas` replicas now: work since the last checkpoint
    (or since the attempt started) plus the time to save and restore, times their GPUs."""
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    unsaved = max(0.0, now - since) if since is not None else 0.0
    count = job.active_replicas if replicas is None else replicas
    return (unsaved + job.save_s + job.restore_s) * job.gpus * count


def protected(job: Job, now: float) -> bool:
    """A job inside its min_runtime (counted from the start of its attempt) cannot be a victim."""
    if job.min_runtime_s <= 0:
        return False
    return job.started_at is None or now - job.started_at < job.min_runtime_s


def may_be_victim(job: Job, now: float) -> bool:
    """A job that is giving some replicas back (a stop of its extras not yet answered) is
    still a victim for the replicas it keeps (rule 5), as it is in the cycle that asked: the
    units count only its active replicas, and the ones stopping count as releasing."""
    return (
        job.preemptible
        and job.phase in ("starting", "running")
        and job.active_replicas > 0
        and not job.lost_node  # asked to stop already: its GPUs count as releasing
        and not job.drained
        and not job.nomination
        and not protected(job, now)
    )


def units_of(jobs: list[Job], order: VictimOrder, now: float) -> list[Unit]:
    """The victim units of these jobs, in the order they would be taken (rules 4, 5 and 9):
    lowest job priority first; among equal priority, extra replicas of elastic jobs before
    whole jobs; then the newest job (`newest`) or the least lost work (`cost`, then the
    newest). A job's own extras (newest replica first) always come before the job as a whole.

    `jobs` must be in submission order (as `ClusterState.live` keeps them), so newest first
    is their reverse: units are put in buckets by priority and kind instead of sorted by a
    key holding each job's `seq`, an object of its own elsewhere in memory. At 17,000
    victims the sort cost 4.6 times the buckets, most of it in reading those."""
    buckets: dict[tuple[int, int], list[Unit]] = {}
    for job in reversed(jobs):
        priority = job.priority
        if job.replicas > job.min_replicas:  # only an elastic job holds extras (the fold's rule)
            extra = job.active_replicas - job.min_replicas
            if extra > 0:
                units = buckets.setdefault((priority, 0), [])
                units.extend(Unit(job, True) for _ in range(extra))
        buckets.setdefault((priority, 1), []).append(Unit(job, False))
    ordered: list[Unit] = []
    for (_, kind), units in sorted(buckets.items()):
        if order == "cost":  # stable: equal costs stay newest first, a job's extras together
            if kind == 0:
                units.sort(key=lambda u: lost_work_gpu_s(u.job, now, 1))
            else:
                units.sort(key=lambda u: lost_work_gpu_s(u.job, now))
        ordered.extend(units)
    return ordered


def is_near(unit: Unit, nodes: set[str]) -> bool:
    """Has the unit's job a replica on one of these nodes?"""
    held = unit.job.held
    return held[0].node in nodes or any(r.node in nodes for r in held)


def look_up_after(nodes: set[str]) -> int:
    """How many entries of a lineup a walk for units near these nodes passes over one by one
    before it looks the near ones up by node instead (`Lineup.on_nodes`): about what the
    look-up costs. A walk then spends at most about twice the cheaper of the two."""
    return len(nodes) // 8


class VictimIndex:
    """The possible victims of one pool in one cycle: found once, their units sorted per
    project when first needed, and counted (sizes, priorities) for the bounds that spare a
    walk. A project's units (and the pool's) are a `Lineup`: units taken for good since they
    were listed (their job stopping, nominated or grown this cycle, a surplus replica given up)
    stay in it, and its walks pass over them."""

    def __init__(
        self, order: VictimOrder, now: float, owners: Mapping[str, Mapping[int, str]]
    ) -> None:
        self.order = order
        self.now = now
        self._owners = owners
        self.running: list[Job] = []  # filled by the cycle: jobs holding GPUs in this pool
        self.gone: set[str] = set()  # stopping, nominated or grown this cycle: no victim
        #: per project: each change to its victims, in order (a job taken for good, by its
        #: id, or a unit spent), so that what was worked out from them knows when to work it
        #: out again, and what to patch
        self.passed: dict[str, list[str | Unit]] = {}
        self._jobs: dict[str, list[Job]] | None = None
        self._in_order: list[Job] = []  # the same, in submission order
        self._units: dict[str, Lineup] = {}
        self._pool_units: Lineup | None = None
        # per project (once asked): how many live units free so many GPUs / have a priority
        self._sizes: dict[str, dict[int, int]] = {}
        self._priorities: dict[str, dict[int, int]] = {}
        #: per project: what its victims on several nodes hold beyond one replica each
        self._spread: dict[str, int] = {}
        self._most_held_on_a_node: int | None = None
        self._held_below: dict[tuple[str, int], dict[str, int]] = {}
        self._by_priority: dict[str, dict[int, dict[str, int]]] = {}
        self._held_at_least: dict[tuple[str, int, int], frozenset[str]] = {}

    def jobs(self) -> dict[str, list[Job]]:
        """Jobs of this pool that may be victims, per project (found once per cycle; those gone
        since are still listed)."""
        if self._jobs is None:
            by_project: dict[str, list[Job]] = {}
            gone, now = self.gone, self.now
            for job in self.running:
                # `gone` is mostly empty here: asked first, it spares reading every job's id
                if may_be_victim(job, now) and (not gone or job.id not in gone):
                    by_project.setdefault(job.project, []).append(job)
                    self._in_order.append(job)
            self._jobs = by_project
        return self._jobs

    def lineup(self, project: str) -> Lineup:
        """The project's victim units in taking order."""
        units = self._units.get(project)
        if units is None:
            gone = self.gone
            jobs = self.jobs().get(project, [])
            if gone:
                jobs = [j for j in jobs if j.id not in gone]
            units = self._units[project] = Lineup(units_of(jobs, self.order, self.now))
        return units

    def pool_lineup(self) -> Lineup:
        """All victim units of the pool, whatever their project, in taking order."""
        if self._pool_units is None:
            self.jobs()
            gone = self.gone
            jobs = [j for j in self._in_order if j.id not in gone] if gone else self._in_order
            self._pool_units = Lineup(units_of(jobs, self.order, self.now))
        return self._pool_units

    def largest_unit_gpus(self, project: str) -> int:
        """The most GPUs one victim unit of the project frees (0 if it has none)."""
        sizes, _ = self._unit_counts(project)
        return max((g for g, n in sizes.items() if n), default=0)

    def lowest_priority(self, project: str) -> float:
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
            self._most_held_on_a_node = max(map(len, self._owners.values()), default=0)
        self._unit_counts(project)  # works out the project's _spread with its unit counts
        return self._most_held_on_a_node + self._spread[project]

    def held_below(self, project: str, priority: int) -> dict[str, int]:
        """At least the GPUs the project's possible victims of lower priority than this could
        free, per node: all they hold there (those gone since still counted, so it stays an
        upper bound for the cycle). Worked out once per project and priority, from what its
        victims hold per priority (`_held_by_priority`)."""
        key = (project, priority)
        found = self._held_below.get(key)
        if found is None:
            found = self._held_below[key] = {}
            for below, held in self._held_by_priority(project).items():
                if below < priority:
                    for node, gpus in held.items():
                        found[node] = found.get(node, 0) + gpus
        return found

    def _held_by_priority(self, project: str) -> dict[int, dict[str, int]]:
        """What the project's possible victims hold per node, per job priority: read from
        its jobs once. Worked out for each priority asked, the jobs were read again each time:
        at 4x the bench's size 30 asks read 18,000 jobs and their replicas, nine times as many
        as at 1x."""
        found = self._by_priority.get(project)
        if found is None:
            found = self._by_priority[project] = {}
            for job in self.jobs().get(project, ()):
                held = found.get(job.priority)
                if held is None:
                    held = found[job.priority] = {}
                for r in job.held:
                    held[r.node] = held.get(r.node, 0) + len(r.gpus)
        return found

    def held_at_least(self, project: str, priority: int, gpus: int) -> frozenset[str]:
        """The nodes where `held_below(project, priority)` is at least `gpus` (worked out once
        for each)."""
        key = (project, priority, gpus)
        found = self._held_at_least.get(key)
        if found is None:
            held = self.held_below(project, priority)
            found = self._held_at_least[key] = frozenset(n for n, g in held.items() if g >= gpus)
        return found

    def forget(self, jobs: Iterable[Job]) -> None:
        """These jobs are now stopping, nominated or given GPUs: victims no more this cycle."""
        for job in jobs:
            if job.id in self.gone:
                continue
            self.gone.add(job.id)
            self.passed.setdefault(job.project, []).append(job.id)
            for lineup in self._lineups_of(job.project):
                lineup.pass_job(job.id)
            sizes = self._sizes.get(job.project)
            priorities = self._priorities.get(job.project)
            # counted then if it may be a victim (a job gone before was skipped there)
            if sizes is not None and priorities is not None and may_be_victim(job, self.now):
                _count_units(job, sizes, priorities, -1)

    def spend(self, units: Iterable[Unit]) -> None:
        """These units were taken by a preemption of this cycle: no walk takes them again."""
        for unit in units:
            self.passed.setdefault(unit.project, []).append(unit)
            for lineup in self._lineups_of(unit.project):
                lineup.pass_unit(unit)

    def _lineups_of(self, project: str) -> tuple[Lineup, ...]:
        """The lineups listed so far that may hold the project's units."""
        own, pool = self._units.get(project), self._pool_units
        if pool is None:
            return () if own is None else (own,)
        return (pool,) if own is None else (own, pool)

    def _unit_counts(self, project: str) -> tuple[dict[int, int], dict[int, int]]:
        sizes = self._sizes.get(project)
        priorities = self._priorities.get(project)
        if sizes is None or priorities is None:
            sizes = self._sizes[project] = {}
            priorities = self._priorities[project] = {}
            spread = 0
            gone = self.gone
            for job in self.jobs().get(project, ()):
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


def _count_units(job: Job, sizes: dict[int, int], priorities: dict[int, int], sign: int) -> None:
    """Add (or with sign -1 remove) the job's victim units: each surplus replica, the whole."""
    surplus = max(0, job.active_replicas - job.min_replicas)
    sizes[job.gpus] = sizes.get(job.gpus, 0) + sign * surplus
    whole = job.gpus * job.active_replicas
    sizes[whole] = sizes.get(whole, 0) + sign
    priorities[job.priority] = priorities.get(job.priority, 0) + sign * (surplus + 1)


class Lineup:
    """Victim units in taking order, and a way past those taken for good this cycle.

    A claimant's walk goes down the lineup from the front, and every preemption takes units
    from the middle of it (those it needs, after sparing the rest): skipping them one by one,
    each walk read every unit taken before it, and at 4x the bench's size the burst cycle's
    walks read a million such units (4x the claimants, each reading 4x the taken). Each
    position points at the next that may still be taken (itself while it may), and a walk
    follows the pointers, shortening them as it goes (path halving), so a run of taken units
    is passed in a step or two."""

    __slots__ = ("_by_node", "_first", "_indexed", "_next", "_whole", "units")

    def __init__(self, units: list[Unit]) -> None:
        self.units = units
        self._next = list(range(len(units) + 1))  # the last is the end: it points at itself
        # where each job's units are, once one is passed: its first unit (its extras are
        # listed together, `units_of`), and its whole unit where that is not the first.
        # Numbers, not a list per job: lists are objects the garbage collector must walk,
        # and one per victim made it sweep the whole cluster's state more often
        self._first: dict[str, int] | None = None
        self._whole: dict[str, int] = {}
        # per node, where the units of jobs with a replica there are, for the units before
        # `_indexed` (`on_nodes`: read only as far as a walk asks)
        self._by_node: dict[str, list[int]] = {}
        self._indexed = 0

    def live_from(self, i: int) -> int:
        """The first position from `i` on whose unit has not been passed (the length if none)."""
        after = self._next
        while after[i] != i:
            after[i] = after[after[i]]
            i = after[i]
        return i

    def pass_job(self, job_id: str) -> None:
        """The job is taken for good: pass all its units."""
        i = self._firsts().get(job_id)
        if i is None:
            return
        units = self.units
        while i < len(units) and units[i].surplus and units[i].job.id == job_id:
            self._pass(i)
            i += 1
        self._pass(self._whole.get(job_id, i))

    def positions(self, job_id: str) -> list[int]:
        """Where the job's units are: its extras (listed together), then its whole unit."""
        i = self._firsts().get(job_id)
        if i is None:
            return []
        units, found = self.units, []
        while i < len(units) and units[i].surplus and units[i].job.id == job_id:
            found.append(i)
            i += 1
        found.append(self._whole.get(job_id, i))
        return found

    def on_nodes(self, nodes: set[str], upto: int) -> list[int]:
        """The positions before `upto` of the units whose job holds a replica on one of these
        nodes, ascending (passed units included)."""
        by_node = self._by_node
        for i in range(self._indexed, upto):
            held = self.units[i].job.held
            first = held[0].node
            by_node.setdefault(first, []).append(i)
            if len(held) > 1:  # a gang or an elastic job: once per node it holds a replica on
                for node in {r.node for r in held[1:]} - {first}:
                    by_node.setdefault(node, []).append(i)
        self._indexed = max(self._indexed, upto)
        found = [by_node[node] for node in nodes if node in by_node]
        if len(found) == 1:
            return [i for i in found[0] if i < upto]
        return sorted({i for positions in found for i in positions if i < upto})

    def pass_unit(self, unit: Unit) -> None:
        i = self._firsts().get(unit.job.id)
        if i is None:
            return
        units = self.units
        if not unit.surplus:
            self._pass(self._whole.get(unit.job.id, i))
            return
        while i < len(units) and units[i].job is unit.job:
            if units[i] is unit:
                self._pass(i)
                return
            i += 1

    def _pass(self, i: int) -> None:
        if self._next[i] == i:
            self._next[i] = i + 1

    def _firsts(self) -> dict[str, int]:
        if self._first is None:
            first: dict[str, int] = {}
            for i, unit in enumerate(self.units):
                job_id = unit.job.id
                if job_id not in first:
                    first[job_id] = i
                elif not unit.surplus:
                    self._whole[job_id] = i
            self._first = first
        return self._first
