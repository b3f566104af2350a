"""Every scenario the live engine runs (the suite and its anchors) on the services in one
process: the in-memory log, a virtual clock moved by the scenario's `advance`, and a real node
executor per node whose replicas do the scenario's work; with the verdict the core engine
gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.scenario.runner import run_file

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
ALL = sorted([*SUITE.glob("*.yaml"), *(SUITE / "anchors").glob("*.yaml")])


def test_the_whole_suite_and_its_anchors_are_here() -> None:
    assert len(ALL) >= 80 + 40


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_same_verdict_as_the_core_engine(path: Path) -> None:
    core, services = run_file(path, "core"), run_file(path, "in-process")
    assert services.verdict == core.verdict == "pass", "\n".join(
        [services.reason, *services.problems]
    )
