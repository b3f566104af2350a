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

from hypothesis import given, settings
from hypothesis import strategies as st

from events import JobSpec, ProjectTerms
from policy.candidates import Candidate
from policy.cycle import decide
from policy.pool_cycle import PoolCycle
from policy.schedulers import reclaim, reclaim_order
from policy.victim_search import Taken, take_until_fits
from simulation.virtual_cluster import VirtualCluster

PROJECTS = ("a", "b", "c", "d")


def _plain(cycle: PoolCycle, cand: Candidate, givers: list[str], within: bool) -> Taken | None:
    held = {project: cycle.accounts.account(project).usage for project in givers}
    return take_until_fits(cycle, cand, reclaim._ServedLast(cycle, held, within, None))


@contextmanager
def walking_victim_by_victim() -> Iterator[None]:
    with patch.object(reclaim, "first_fit", _plain):
        yield


@st.composite
def borrowed_by_many(draw: st.DrawFn) -> VirtualCluster:
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
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            replicas=draw(st.sampled_from([1, 1, 2])),
        )
        vc.submit(f"claim{i}", spec)
    return vc


@settings(max_examples=200, deadline=None)
@given(borrowed_by_many())
def test_the_kept_order_decides_as_walking_victim_by_victim(vc: VirtualCluster) -> None:
    for _ in range(4):  # this cycle and those after it, as their decisions land
        plan = decide(vc.state, vc.now)
        with walking_victim_by_victim():
            assert decide(vc.state, vc.now) == plan
        if not plan:
            return
        vc.cycle()


def _listed_afresh(offers: reclaim_order.Offers) -> reclaim_order.Offers:
    """The project's list worked out from scratch, listed as far as `offers` is."""
    fresh = reclaim_order.Offers(offers._cycle, offers.victim.project)
    if offers.units:
        fresh.offer(len(offers.units) - 1, -1)
    return fresh


@settings(max_examples=200, deadline=None)
@given(borrowed_by_many())
def test_a_patched_list_is_the_list_worked_out_afresh(vc: VirtualCluster) -> None:
    patched = 0
    real_patch = reclaim_order.Offers.patch

    def checked(offers: reclaim_order.Offers) -> bool:
        nonlocal patched
        if not real_patch(offers):
            return False
        patched += 1
        fresh = _listed_afresh(offers)
        assert [id(u) for u in offers.units] == [id(u) for u in fresh.units]
        assert (offers.freed, offers.held, offers.keys) == (fresh.freed, fresh.held, fresh.keys)
        assert (offers._left, offers._at, offers._surplus) == (
            fresh._left,
            fresh._at,
            fresh._surplus,
        )
        return True

    with patch.object(reclaim_order.Offers, "patch", checked):
        decide(vc.state, vc.now)
