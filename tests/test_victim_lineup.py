"""The victim lineups' pointers past units taken for good decide nothing themselves.

A walk down a project's (or the pool's) victims passes, in a step, the units whose job is
stopping, nominated or grown this cycle and the surplus replicas already given up
(`policy.victims.Lineup`). The plain walk reads every unit and skips those itself: over random
clusters where one project borrowed GPUs, another claims its share back and the borrower's
urgent work arrives (several preemptions in one cycle, so units are taken from the middle of
a lineup), under every scheduler that preempts, the policy decides the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from events import ClusterConfigured, ClusterSettings, SchedulerSettings
from policy.cycle import decide
from policy.victims import Lineup
from simulation.virtual_cluster import VirtualCluster
from tests.test_preemption_bounds import borrowed_then_claimed


@contextmanager
def walking_every_unit() -> Iterator[None]:
    """Lineups that pass nothing: every walk reads every unit from the front."""
    with patch.object(Lineup, "_pass", lambda self, i: None):
        yield


@settings(max_examples=200, deadline=None)
@given(borrowed_then_claimed(), st.sampled_from(["fair_share", "priority"]))
def test_passing_taken_units_decides_as_reading_them(vc: VirtualCluster, scheduler: str) -> None:
    settings_ = ClusterSettings(scheduler=SchedulerSettings(type=scheduler))  # type: ignore[arg-type]
    vc.configure(ClusterConfigured(id="cfg", time=vc.now, actor="test", settings=settings_))
    for _ in range(4):  # this cycle and those after it, as their decisions land
        plan = decide(vc.state, vc.now)
        with walking_every_unit():
            assert decide(vc.state, vc.now) == plan
        if not plan:
            return
        vc.cycle()
