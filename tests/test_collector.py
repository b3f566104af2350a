"""A cycle runs with the cyclic garbage collector paused (policy/collector.py): it leaves the
collector as it found it, and leaves no garbage that only the collector could free."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from bench.policy_cycle import NOW, Size, build
from events import JobNominated, JobPreemptionRequested
from policy import collector
from policy.candidate_search import gather
from policy.candidates import Candidate
from policy.cycle import decide
from policy.state import ClusterState

#: a burst: a long queue, projects off their shares, so the cycle places, reclaims and
#: preempts within projects (the paths that build the most, the reclaim's lists among them)
BURST = Size(nodes=40, running=200, pending=400)


@pytest.fixture(scope="module")
def burst() -> ClusterState:
    return build(BURST, seed=3).state


@pytest.fixture
def collector_restored() -> Iterator[None]:
    was_on = gc.isenabled()
    yield
    if was_on:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector_restored")
@pytest.mark.parametrize("on", [True, False])
def test_a_cycle_runs_paused_and_leaves_the_collector_as_it_found_it(
    burst: ClusterState, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside: list[bool] = []  # whether the collector was on, seen from inside the cycle

    def gather_seen(*args: Any) -> Any:
        inside.append(gc.isenabled())
        return gather(*args)

    monkeypatch.setattr("policy.cycle.gather", gather_seen)
    if on:
        gc.enable()
    else:
        gc.disable()
    decide(burst, NOW)
    assert inside == [False]
    assert gc.isenabled() is on


@pytest.mark.usefixtures("collector_restored")
def test_an_error_inside_leaves_the_collector_on() -> None:
    gc.enable()
    with pytest.raises(RuntimeError, match="inside"), collector.paused():
        assert not gc.isenabled()
        raise RuntimeError("inside")
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_restored")
def test_a_cycle_leaves_no_garbage_for_the_collector(burst: ClusterState) -> None:
    """What pausing relies on: everything a cycle makes is freed by reference counting when
    it returns. A loop through the cycle's objects (the reclaim's lists refer back to the
    pool's cycle, which `PoolCycle.close` breaks) would be found here."""
    gc.collect()
    gc.disable()
    plan = decide(burst, NOW)
    reasons = {e.reason for e in plan.events if isinstance(e, JobPreemptionRequested)}
    assert {"reclaim", "priority"} <= reasons  # the reclaim's lists were built
    assert any(isinstance(e, JobNominated) for e in plan.events)
    del plan
    assert gc.collect() == 0
    assert gc.garbage == []


@pytest.mark.usefixtures("collector_restored")
def test_a_plan_keeps_no_candidate_alive(burst: ClusterState) -> None:
    """The collector's first pass after a cycle (its allocations count towards it) walks all
    the cycle made that is still alive: the plan names the jobs left waiting from lists of
    the jobs, frozen with the state, not from the cycle's candidates (40,000 at 4x the
    bench's size, most of that pass)."""
    gc.collect()
    gc.disable()
    plan = decide(burst, NOW)
    assert "no_fit" in plan.waiting.values()  # jobs left waiting for room were named
    alive = [o for o in gc.get_objects() if isinstance(o, Candidate)]
    assert alive == []
