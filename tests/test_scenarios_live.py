"""Scenarios on the live engine: the real services, a real nats-server, real workloads.

Every scenario of the suite that needs no virtual clock runs here too, and must give the same
verdict as on the core engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.scenario.runner import run_file
from simulation.spec import load_scenario

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
LIVE = [p for p in sorted(SUITE.glob("*.yaml")) if load_scenario(p).needs_virtual_clock is None]


def test_most_of_the_suite_runs_live() -> None:
    assert len(LIVE) >= 4


@pytest.mark.parametrize("path", LIVE, ids=[p.stem for p in LIVE])
def test_same_verdict_on_both_engines(path: Path) -> None:
    core, live = run_file(path, "core"), run_file(path, "live")
    assert live.verdict == core.verdict == "pass", "\n".join([live.reason, *live.problems])
