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


#: A lean sample on the live engine in every run (the whole set takes about 5 minutes there:
#: `fairlane scenario run scenarios/anchors/*.yaml --engine live`): one of each kind of case,
#: the virtual clock's among them.
LIVE_SAMPLE = (
    "determined-priority-full-pool-higher-priority-preempts",
    "kai-fair-share-three-queues-over-subscribed",
    "kai-preempt-after-preemption-delay",
    "kai-preempt-newest-of-equal-priority",
    "kai-reclaim-unit-gang-from-two-projects",
    "kai-reclaim-unit-victim-project-goes-below-quota",
    "kai-s27-quotas-outgrow-pool-in-project-preempt",
)


@pytest.mark.slow
@pytest.mark.nats
@pytest.mark.parametrize("name", LIVE_SAMPLE)
def test_anchor_passes_live(name: str) -> None:
    result = run_file(ANCHORS / f"{name}.yaml", "live")
    assert result.verdict == "pass", "\n".join([result.reason, *result.problems])
