"""Every scenario of the suite passes on the core engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.scenario.runner import run_file

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
FILES = sorted(SUITE.glob("*.yaml"))


def test_the_suite_is_there() -> None:
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_passes_on_core(path: Path) -> None:
    result = run_file(path, "core")
    assert result.verdict == "pass", "\n".join([result.reason, *result.problems])
    assert result.expectations > 0
