"""Scenarios on the live engine: the real services on a real nats-server.

Every scenario of the suite runs here, none skipped, and must give the same verdict as on the
core engine: one that moves time or simulates work on a virtual clock the services decide on
(with real executors whose replicas do the scenario's work on it), the others on the wall
clock with real workloads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from events import JobCompleted, JobStarted
from services.runtime.clock import VirtualClock
from simulation.scenario.live_engine import LiveEngine
from simulation.scenario.observe import check
from simulation.scenario.runner import run_file
from simulation.spec import load_scenario, parse_scenario

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
ALL = sorted(SUITE.glob("*.yaml"))


def test_the_whole_suite_runs_live() -> None:
    assert len(ALL) >= 80
    assert any(load_scenario(p).needs_virtual_clock for p in ALL)


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_same_verdict_on_both_engines(path: Path) -> None:
    core, live = run_file(path, "core"), run_file(path, "live")
    assert live.verdict == core.verdict == "pass", "\n".join([live.reason, *live.problems])


TWO_HOURS = parse_scenario(
    {
        "name": "two-hours-of-work",
        "pools": [{"name": "default", "nodes": [{"name": "n0", "gpus": 2}]}],
        "projects": [{"name": "a", "quota": 2}],
        "steps": [
            {"submit": {"id": "x", "project": "a", "duration": "2h"}},
            {"advance": "1h"},
            {"expect": {"running": ["x"]}},
            {"advance": "1h"},
            {"expect": {"completed": ["x"]}},
        ],
    },
    Path("two-hours-of-work.yaml"),
)


async def test_work_finishes_on_the_virtual_clock_of_the_live_services() -> None:
    """Two hours of simulated work end when `advance` has moved the services' clock two hours
    on, not before, and the log says so in the events' own times: every service stamps its
    events with the virtual clock."""
    engine = LiveEngine(TWO_HOURS)
    assert isinstance(engine.clock, VirtualClock)
    try:
        await asyncio.wait_for(engine.start(), 60)
        for step in TWO_HOURS.steps:
            if step.kind == "expect":
                assert check(step.value, engine.observe()) == [], step
            else:
                await asyncio.wait_for(engine.step(step), 60)
    finally:
        await engine.stop()
    started = next(e for e in engine.events if isinstance(e, JobStarted))
    completed = next(e for e in engine.events if isinstance(e, JobCompleted))
    assert completed.time - started.time == 7200.0
    assert engine.clock.now() == started.time + 7200.0
    assert max(e.time for e in engine.events) == engine.clock.now()
