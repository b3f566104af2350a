"""The victim search: taking victims one at a time until a candidate fits, then sparing each
one it can do without (rule 5: only as many as needed).

The schedulers say which victim comes next (a `pick`) and what must hold besides fitting (an
`Enough`); this module keeps what the victims taken so far free, and spares the unneeded.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from events import Replica
from policy.candidates import Candidate
from policy.capacity import Capacity, Overlay, OverlayFit
from policy.state import Job
from policy.victims import Unit, VictimIndex, is_near, look_up_after


class SearchCycle(Protocol):
    """What a victim search reads of the pool's cycle (`pool_cycle.PoolCycle`, which calls the
    search): named here, so that the search imports nothing of the cycle."""

    @property
    def capacity(self) -> Capacity: ...

    @property
    def releasing(self) -> dict[str, list[int]]: ...

    @property
    def surplus_stopped(self) -> dict[str, int]: ...

    @property
    def used_units(self) -> set[int]: ...

    @property
    def victims(self) -> VictimIndex: ...


#: A rule a set of victims must satisfy besides making room, given the GPUs they free per project
Enough = Callable[[Mapping[str, int]], bool]
#: Chooses the next victim (and what it frees), or None when there is none left
Pick = Callable[["Taken"], tuple[Unit, list[Replica]] | None]


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


def new_taken(cycle: SearchCycle) -> Taken:
    """No victims yet: what is free besides the idle GPUs is what stopping jobs give back
    (rule 7)."""
    overlay = {node: list(gpus) for node, gpus in cycle.releasing.items() if gpus}
    return Taken(cycle.surplus_stopped, cycle.used_units, overlay)


def fits_with(cycle: SearchCycle, cand: Candidate, taken: Taken) -> bool:
    job = cand.job
    return cycle.capacity.fits(job.gpus, cand.replicas, job.node, cand.ports, taken.overlay)


def take_until_fits(
    cycle: SearchCycle,
    cand: Candidate,
    pick: Pick,
    enough: Enough | None = None,
) -> Taken | None:
    """Take victims one at a time (`pick` chooses the next) until the candidate fits (and
    `enough` holds), then spare every victim the candidate can do without (rule 5: only
    as many as needed). None if it never fits: then nobody is preempted."""
    taken = new_taken(cycle)
    fit = overlay_fit(cycle, cand, taken.overlay)  # asked after every victim: kept up to date
    while not (fit.fits() and (enough is None or enough(taken.freed_by_project))):
        chosen = pick(taken)
        if chosen is None:
            return None
        taken.add(*chosen)
        for r in chosen[1]:
            fit.resize(r.node, len(taken.overlay[r.node]))
    return spare_unneeded(cycle, cand, taken, enough)


def overlay_fit(cycle: SearchCycle, cand: Candidate, overlay: Overlay) -> OverlayFit:
    job = cand.job
    return OverlayFit(cycle.capacity, job.gpus, cand.replicas, job.node, overlay, cand.ports)


def spare_unneeded(
    cycle: SearchCycle, cand: Candidate, taken: Taken, enough: Enough | None
) -> Taken:
    """Go through the victims in the order they were taken and spare each one the candidate
    can do without: it still fits, and every rule (`enough`) still holds. (What the
    victims left free is worked out as if they had been taken afresh, in this order.)"""
    if len(taken.units) < 2 and (not taken.units or not _fits_bare(cycle, cand, enough)):
        return taken
    alone = _last_alone(cycle, cand, taken, enough)
    if alone is not None:
        return alone
    kept = _KeptVictims(cycle, cand, taken)
    for unit in taken.units:
        kept.spare_if_unneeded(unit, enough)
    spared = kept.units()
    return taken_of(cycle, spared) if len(spared) < len(taken.units) else taken


def _last_alone(
    cycle: SearchCycle, cand: Candidate, taken: Taken, enough: Enough | None
) -> Taken | None:
    """The last victim taken, alone, if it makes room by itself (and every rule holds) and
    no other victim is of its job: then sparing one by one spares every victim before it
    (what is left always holds the last one, whose GPUs do not depend on victims of other
    jobs, and more freed GPUs never fit worse) and keeps the last (the candidate did not
    fit before it was taken). Found without sparing victim by victim: a gang waiting for a
    whole node often takes hundreds of small victims before one frees the node."""
    last = taken.units[-1]
    if any(u.job.id == last.job.id for u in taken.units[:-1]):
        return None
    alone = taken_of(cycle, [last])
    if not fits_with(cycle, cand, alone):
        return None
    if enough is not None and not enough(alone.freed_by_project):
        return None
    return alone


def _fits_bare(cycle: SearchCycle, cand: Candidate, enough: Enough | None) -> bool:
    bare = new_taken(cycle)
    return fits_with(cycle, cand, bare) and (enough is None or enough(bare.freed_by_project))


def taken_of(cycle: SearchCycle, units: list[Unit]) -> Taken:
    """These victims taken afresh, in this order (what each frees is worked out again)."""
    taken = new_taken(cycle)
    for unit in units:
        freed = taken.replicas_freed(unit)
        if freed:
            taken.add(unit, freed)
    return taken


def next_unit(
    cycle: SearchCycle, project: str, taken: Taken, pin: str | None, admit: Callable[[Unit], bool]
) -> tuple[Unit, list[Replica]] | None:
    """The next unit of `project` that `admit` accepts and that frees GPUs the candidate
    could use, without taking it."""
    lineup = cycle.victims.lineup(project)
    units, gone = lineup.units, cycle.victims.gone
    i = lineup.live_from(taken.cursor.get(project, 0))
    while i < len(units):
        unit = units[i]
        if unit.job.id not in gone:  # the lineup passes these: asked, it needs not be right
            freed = taken.replicas_freed(unit) if admit(unit) else []
            if freed and (pin is None or any(r.node == pin for r in freed)):
                taken.cursor[project] = i
                return unit, freed
        i = lineup.live_from(i + 1)
    taken.cursor[project] = i
    return None


class NearWalk:
    """`next_unit` for a walk that admits only units of jobs with a replica on one of `nodes`
    and of job priority below `priority` (rule 4's walk for a replica of several GPUs, where
    only some nodes could make room for one). It passes over the others one by one until
    that has cost about a look-up by node (`look_up_after`), then visits only the positions
    the look-up found (`Lineup.on_nodes`), the same units in the same order. At 4x the
    bench's size such walks passed over ten times the units they did at 1x: the gaps between
    near jobs grow with the pool."""

    __slots__ = ("budget", "lineup", "near", "nodes", "priority", "project")

    def __init__(self, victims: VictimIndex, project: str, nodes: set[str], priority: int) -> None:
        self.lineup = victims.lineup(project)
        self.project = project
        self.nodes = nodes
        self.priority = priority
        self.budget = look_up_after(nodes)
        self.near: list[int] | None = None  # positions near the nodes, once looked up

    def next(self, taken: Taken, gone: set[str]) -> tuple[Unit, list[Replica]] | None:
        lineup, units = self.lineup, self.lineup.units
        i = lineup.live_from(taken.cursor.get(self.project, 0))
        while self.near is None and i < len(units):
            if self.budget <= 0:
                self.near = lineup.on_nodes(self.nodes, len(units))
                break
            self.budget -= 1
            found = self._frees(taken, gone, i)
            if found is not None:
                return found
            i = lineup.live_from(i + 1)
        near = self.near
        if near is not None:
            for k in range(bisect.bisect_left(near, i), len(near)):
                position = near[k]
                if lineup.live_from(position) == position:
                    found = self._frees(taken, gone, position)
                    if found is not None:
                        return found
            i = len(units)
        taken.cursor[self.project] = i
        return None

    def _frees(self, taken: Taken, gone: set[str], i: int) -> tuple[Unit, list[Replica]] | None:
        """The unit at i if the walk admits it and it frees GPUs (the walk then stops there)."""
        unit = self.lineup.units[i]
        job = unit.job
        if job.id in gone or job.priority >= self.priority or not is_near(unit, self.nodes):
            return None
        freed = taken.replicas_freed(unit)
        if not freed:
            return None
        taken.cursor[self.project] = i
        return unit, freed


class _KeptVictims:
    """The victims kept while sparing (`spare_unneeded`), what they free and whether
    the candidate fits, changed one victim at a time.

    Sparing asks, for each victim in turn, whether the candidate still fits without it. Taking
    every kept victim afresh for each question cost k^2 for k victims, and k grows with the
    pool (a gang waiting for whole nodes takes hundreds of small victims at 4x the bench's
    size). A victim's going changes what only its own job's other units free (a surplus
    replica frees the job's newest replica not yet taken), so only that job is worked out
    again, with `Taken`'s own rules, and the fit follows the nodes that changed.
    """

    def __init__(self, cycle: SearchCycle, cand: Candidate, taken: Taken) -> None:
        self._order = taken.units
        self._base = (taken.base_surplus, taken.base_used)
        releasing = new_taken(cycle).overlay
        self._fit = overlay_fit(cycle, cand, releasing)
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
            # spared; units of its job that now free nothing leave too (taken_of drops them)
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
