"""Every scenario translated from a peer's tests (scenarios/anchors) passes on the core engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.scenario.runner import run_file

ANCHORS = Path(__file__).resolve().parent.parent / "scenarios" / "anchors"
FILES = sorted(ANCHORS.glob("*.yaml"))


def test_the_anchors_are_there() -> None:
    assert len(FILES) >= 40


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_anchor_passes_on_core(path: Path) -> None:
    result = run_file(path, "core")
    assert result.verdict == "pass", "\n".join([result.reason, *result.problems])
    assert result.expectations > 0
