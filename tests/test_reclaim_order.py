"""The reclaim's kept taking order decides as the plain walk does.

`reclaim_order.first_fit` merges each giving project's own list of victims (kept across the
claimants of a cycle while the project's usage and victims stand) and works out the victims'
bookkeeping only for the jobs freeing GPUs where the claimant gains room. The plain walk
(`take_until_fits` with `_ServedLast`) picks victim by victim. Over random clusters where
several projects borrowed GPUs of several sizes (elastic jobs and two-node gangs among them)
and the others claim their shares back with jobs of every size (so one cycle makes several
reclaims, each changing some projects' lists and leaving others as they were), the policy
decides the same either way, in this cycle and those after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from hypothesis import event, given, settings
from hypothesis import strategies as st

from events import JobSpec, ProjectTerms
from policy.candidates import Candidate
from policy.cycle import decide
from policy.pool_cycle import PoolCycle
from policy.schedulers import reclaim, reclaim_order
from policy.schedulers.reclaim_reach import Reach
from policy.victim_search import Taken, take_until_fits
from policy.victims import Lineup, units_of
from simulation.virtual_cluster import VirtualCluster

PROJECTS = ("a", "b", "c", "d")


def _plain(cycle: PoolCycle, cand: Candidate, givers: list[str], within: bool) -> Taken | None:
    held = {project: cycle.accounts.account(project).usage for project in givers}
    return take_until_fits(cycle, cand, reclaim._ServedLast(cycle, held, within, None))


@contextmanager
def walking_victim_by_victim() -> Iterator[None]:
    """Every claimant walks, victim by victim: no list, no bound on what victims could free."""
    with (
        patch.object(reclaim, "first_fit", _plain),
        patch.object(reclaim, "could_fit", lambda cycle, cand, within: True),
    ):
        yield


@st.composite
def borrowed_by_many(draw: st.DrawFn, narrow: bool = False) -> VirtualCluster:
    """`narrow`: every claimant asks for replicas of several GPUs."""
    vc = VirtualCluster()
    vc.add_pool("default")
    for n in range(draw(st.integers(2, 5))):
        vc.add_node(f"n{n}", "default", draw(st.sampled_from([4, 8])))
    for project in PROJECTS:
        vc.set_project(project, {"default": ProjectTerms(quota=draw(st.integers(0, 8)))})
    sizes = st.sampled_from([1, 1, 2, 4])
    for i in range(draw(st.integers(4, 20))):  # some projects borrow what is idle
        replicas = draw(st.integers(1, 2))
        spec = JobSpec(
            project=draw(st.sampled_from(PROJECTS[:3])),
            priority_class="train",
            gpus=draw(sizes),
            replicas=replicas,
            min_replicas=draw(st.integers(1, replicas)),
        )
        vc.submit(f"low{i}", spec)
    vc.settle()
    for i in range(draw(st.integers(2, 10))):  # the others claim their shares back
        spec = JobSpec(
            project=draw(st.sampled_from(PROJECTS)),
            priority_class=draw(st.sampled_from(["train", "build"])),
            gpus=draw(st.sampled_from([2, 4, 8] if narrow else [1, 2, 4, 8])),
            replicas=draw(st.sampled_from([1, 1, 2])),
        )
        vc.submit(f"claim{i}", spec)
    return vc


@settings(max_examples=200, deadline=None)
@given(borrowed_by_many())
def test_the_kept_order_decides_as_walking_victim_by_victim(vc: VirtualCluster) -> None:
    for _ in range(4):  # this cycle and those after it, as their decisions land
        # every walk for replicas of several GPUs passes over the jobs on no hopeful
        # node (on so few nodes, few are hopeful only where none is)
        with patch.object(Reach, "few", lambda reach, floor, gpus: gpus > 1):
            plan = decide(vc.state, vc.now)
        with walking_victim_by_victim():
            assert decide(vc.state, vc.now) == plan
        if not plan:
            return
        vc.cycle()


def _as_listed_afresh(offers: reclaim_order.Offers) -> None:
    """The list is what it would be worked out from scratch."""
    cycle = offers._cycle
    kept, cycle.reach = cycle.reach, Reach(cycle)  # the fresh list reports to a reach of its own
    assert kept is not None
    cycle.reach.kept = kept.kept
    fresh = reclaim_order.Offers(cycle, offers.victim.project)
    fresh.offer(1 << 30, -1)  # both listed to the end: where each read to is theirs
    offers.offer(1 << 30, -1)
    cycle.reach = kept
    assert [id(u) for u in offers.units] == [id(u) for u in fresh.units]
    assert offers.freed == fresh.freed
    listed = range(len(offers.units))
    assert [offers.held(i) for i in listed] == [fresh.held(i) for i in listed]
    assert [offers.key(i) for i in listed] == [fresh.key(i) for i in listed]
    assert (offers._surplus, offers.ends) == (fresh._surplus, fresh.ends)


def _as_worked_out_afresh(cycle: PoolCycle) -> None:
    """The cycle's reach is what every project's list worked out from scratch gives."""
    kept, cycle.reach = cycle.reach, Reach(cycle)
    assert kept is not None
    cycle.reach.kept = kept.kept
    for project in cycle.victims.jobs():
        reclaim_order.Offers(cycle, project)  # reports to the fresh reach
    fresh, cycle.reach = cycle.reach, kept
    assert (kept.total, kept.sizes, kept.nodes) == (fresh.total, fresh.sizes, fresh.nodes)


@settings(max_examples=400, deadline=None)
@given(borrowed_by_many())
def test_kept_lists_and_reach_are_those_worked_out_afresh(vc: VirtualCluster) -> None:
    real_update, real_reach_of = reclaim_order.Offers.update, reclaim_order.reach_of

    def update(offers: reclaim_order.Offers) -> bool:
        if not real_update(offers):
            return False
        _as_listed_afresh(offers)
        return True

    def reach_of(cycle: PoolCycle, floor: int | None = None) -> Reach:
        reach = real_reach_of(cycle, floor)
        _as_worked_out_afresh(cycle)
        return reach

    with (
        patch.object(reclaim_order.Offers, "update", update),
        patch.object(reclaim_order, "reach_of", reach_of),
    ):
        for _ in range(3):  # this cycle and those after it, as their decisions land
            if not decide(vc.state, vc.now):
                return
            vc.cycle()


def _victims(taken: Taken | None) -> list[tuple[int, int]] | None:
    """The victims taken, in order, with the GPUs each frees (None: the claimant never fits)."""
    if taken is None:
        return None
    return [(id(unit), gpus) for unit, gpus in zip(taken.units, taken.gpus_freed, strict=True)]


@settings(max_examples=200, deadline=None)
@given(borrowed_by_many(narrow=True), st.sampled_from([0, 0, 1, 3]))
def test_a_walk_looking_lists_up_by_node_takes_the_plain_walks_victims(
    vc: VirtualCluster, look_up_after: int
) -> None:
    """Every walk for replicas of several GPUs passes over the jobs on no hopeful node;
    each list is looked up by node once it has passed over `look_up_after` of them (0: at
    once). Each walk takes the same victims, in the same order, as the plain walk."""
    real_first_fit = reclaim_order.first_fit
    looked_up = 0
    real_look_up = reclaim_order._Hopeful.look_up

    def look_up(
        hopeful: reclaim_order._Hopeful, offers: reclaim_order.Offers, place: int
    ) -> list[int]:
        nonlocal looked_up
        looked_up += 1
        return real_look_up(hopeful, offers, place)

    def checked(cycle: PoolCycle, cand: Candidate, givers: list[str], within: bool) -> Taken | None:
        found = real_first_fit(cycle, cand, givers, within)
        assert _victims(found) == _victims(_plain(cycle, cand, list(givers), within))
        return found

    with (
        patch.object(Reach, "few", lambda reach, floor, gpus: gpus > 1),
        patch.object(reclaim_order, "look_up_after", lambda hopeful: look_up_after),
        patch.object(reclaim_order._Hopeful, "look_up", look_up),
        patch.object(reclaim, "first_fit", checked),
    ):
        for _ in range(3):  # this cycle and those after it, as their decisions land
            if not decide(vc.state, vc.now):
                break
            vc.cycle()
    event(f"lists looked up: {min(looked_up, 3)}")


@settings(max_examples=200, deadline=None)
@given(borrowed_by_many(), st.data())
def test_a_lineup_finds_the_units_of_jobs_on_given_nodes(
    vc: VirtualCluster, data: st.DataObject
) -> None:
    """`Lineup.on_nodes` finds exactly the units before the position asked whose job has a
    replica on one of the nodes, however far it was read before."""
    lineup = Lineup(units_of([j for j in vc.state.live.values() if j.held], "newest", vc.now))
    names = sorted(vc.state.nodes)
    for _ in range(3):
        nodes = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
        upto = data.draw(st.integers(0, len(lineup.units)))
        expected = [
            i
            for i, unit in enumerate(lineup.units[:upto])
            if any(r.node in nodes for r in unit.job.held)
        ]
        assert lineup.on_nodes(nodes, upto) == expected
