"""The bounds that spare the policy walks through victims decide nothing themselves.

`fair_share._could_end_within_fair_share` skips an in-project walk when the victims it could
keep cannot bring the project down to its fair share (rule 4), and `reclaim_order.could_fit` a
reclaim walk that could never make room (rule 5). Both must give up only on walks that would
end in no preemption, and an in-project walk that passes over victims on nodes where no
replica could ever fit (`fair_share._hopeful`) must keep the same victims: over random
clusters where a project borrowed GPUs, another project claimed its share back, and the
borrower's urgent work arrives, the policy decides the same with the bounds as with every
walk made, victim by victim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from events import JobSpec, ProjectTerms
from policy import victim_search
from policy.cycle import decide
from simulation.virtual_cluster import VirtualCluster
from tests.policy_bounds import walking_every_victim


@st.composite
def borrowed_then_claimed(draw: st.DrawFn) -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("default")
    for n in range(draw(st.integers(1, 4))):
        vc.add_node(f"n{n}", "default", draw(st.sampled_from([2, 4, 8])))
    for project in ("a", "b"):
        quota = draw(st.integers(0, 8))
        vc.set_project(project, {"default": ProjectTerms(quota=quota)})
    sizes = st.sampled_from([1, 1, 2, 4])
    for i in range(draw(st.integers(1, 10))):  # a borrows what is idle
        replicas = draw(st.integers(1, 2))
        spec = JobSpec(
            project="a",
            priority_class="train",
            gpus=draw(sizes),
            replicas=replicas,
            min_replicas=draw(st.integers(1, replicas)),
        )
        vc.submit(f"low{i}", spec)
    vc.settle()
    for i in range(draw(st.integers(0, 6))):  # b claims its share back
        vc.submit(f"b{i}", JobSpec(project="b", priority_class="train", gpus=draw(sizes)))
    if draw(st.booleans()):
        vc.settle()
    for i in range(draw(st.integers(1, 3))):  # a's urgent work
        klass = draw(st.sampled_from(["interactive", "build"]))
        vc.submit(f"high{i}", JobSpec(project="a", priority_class=klass, gpus=draw(sizes)))
    return vc


@settings(max_examples=300, deadline=None)
@given(borrowed_then_claimed())
def test_the_bounds_skip_only_walks_that_would_preempt_nobody(vc: VirtualCluster) -> None:
    _decides_as_walking_every_victim(vc, contextlib.nullcontext)


@settings(max_examples=200, deadline=None)
@given(borrowed_then_claimed(), st.sampled_from([0, 1, 3]))
def test_a_walk_looking_victims_up_by_node_decides_as_passing_over_them(
    vc: VirtualCluster, look_up_after: int
) -> None:
    """An in-project walk for replicas of several GPUs passes over the victims on no hopeful
    node one by one, then looks the near ones up by node (`victim_search.NearWalk`) once it
    has passed over `look_up_after` (0: at once): it decides as every walk made victim by
    victim."""
    _decides_as_walking_every_victim(
        vc, lambda: patch.object(victim_search, "look_up_after", lambda nodes: look_up_after)
    )


def _decides_as_walking_every_victim(
    vc: VirtualCluster, deciding: Callable[[], AbstractContextManager[object]]
) -> None:
    """This cycle and those after it, as their decisions land, decide (inside `deciding`) as
    the policy walking every victim."""
    for _ in range(4):
        with deciding():
            plan = decide(vc.state, vc.now)
        with walking_every_victim():
            assert decide(vc.state, vc.now) == plan
        if not plan:
            return
        vc.cycle()
