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


class VictimIndex:
    """The possible victims of one pool in one cycle: found once, their units sorted per
    project when first needed, and counted (sizes, priorities) for the bounds that spare a
    walk. Lists of units keep those of jobs gone since (stopping, nominated or grown this
    cycle): readers skip them, and every unit before `first_live(project)` is gone."""

    def __init__(
        self, order: VictimOrder, now: float, owners: Mapping[str, Mapping[int, str]]
    ) -> None:
        self.order = order
        self.now = now
        self._owners = owners
        self.running: list[Job] = []  # filled by the cycle: jobs holding GPUs in this pool
        self.gone: set[str] = set()  # stopping, nominated or grown this cycle: no victim
        self._jobs: dict[str, list[Job]] | None = None
        self._in_order: list[Job] = []  # the same, in submission order
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

    def project_units(self, project: str) -> list[Unit]:
        """The project's victim units in taking order (units of jobs gone since included)."""
        units = self._units.get(project)
        if units is None:
            gone = self.gone
            jobs = self.jobs().get(project, [])
            if gone:
                jobs = [j for j in jobs if j.id not in gone]
            units = self._units[project] = units_of(jobs, self.order, self.now)
        return units

    def first_live(self, project: str) -> int:
        """Where the first unit of the project that may not be gone is."""
        units, gone = self.project_units(project), self.gone
        i = self._start.get(project, 0)
        while i < len(units) and units[i].job.id in gone:
            i += 1
        self._start[project] = i
        return i

    def pool_units(self) -> tuple[list[Unit], int]:
        """All victim units of the pool, whatever their project, in taking order (units of jobs
        gone since included), and where the first that may not be gone is."""
        if self._pool_units is None:
            self.jobs()
            gone = self.gone
            jobs = [j for j in self._in_order if j.id not in gone] if gone else self._in_order
            self._pool_units = units_of(jobs, self.order, self.now)
        units, i = self._pool_units, self._pool_start
        while i < len(units) and units[i].job.id in self.gone:
            i += 1
        self._pool_start = i
        return units, i

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

    def forget(self, jobs: Iterable[Job]) -> None:
        """These jobs are now stopping, nominated or given GPUs: victims no more this cycle."""
        for job in jobs:
            if job.id in self.gone:
                continue
            self.gone.add(job.id)
            sizes = self._sizes.get(job.project)
            priorities = self._priorities.get(job.project)
            # counted then if it may be a victim (a job gone before was skipped there)
            if sizes is not None and priorities is not None and may_be_victim(job, self.now):
                _count_units(job, sizes, priorities, -1)

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
