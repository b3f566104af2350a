"""bench.projector still runs (at a tiny size); its figures are reported, never asserted."""

from __future__ import annotations

import pytest
from rich.console import Console

from bench import projector

pytestmark = [pytest.mark.nats]


async def test_bench_projects_a_tiny_log_and_times_the_reads() -> None:
    figures = await projector.run(3000, samples=10, console=Console(quiet=True))
    assert figures.events == 3000 and figures.project_per_s > 0
    assert figures.acked_publish_per_s > 0 and figures.raw_publish_per_s > 0
    assert figures.job_timeline_p50_ms <= figures.job_timeline_p99_ms
