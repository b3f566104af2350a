"""The benchmarks still run (at tiny sizes); their figures are reported, never asserted."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from bench import nats_memory, pipeline, policy_cycle, replay
from bench.policy_cycle import Size
from events.model import SchedulerType


def test_bench_measures_a_tiny_cluster() -> None:
    burst, settled = policy_cycle.measure(1, runs=2, base=Size(nodes=8, running=30, pending=60))
    assert burst.decisions > 0  # the state as built is off its shares
    assert settled.decisions == 0  # settled means the policy has nothing more to do
    assert 0 < burst.p50_ms <= burst.p99_ms


@pytest.mark.parametrize("scheduler", ["priority", "round_robin"])
def test_bench_builds_for_every_scheduler(scheduler: SchedulerType) -> None:
    (burst,) = policy_cycle.measure(
        1, runs=1, base=Size(nodes=4, running=10, pending=20), settled=False, scheduler=scheduler
    )
    assert burst.decisions > 0 and burst.p50_ms > 0  # the scheduler ran and decided


def test_bench_command_line_writes_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(policy_cycle, "BASE", Size(nodes=4, running=10, pending=20))
    with pytest.raises(SystemExit) as done:  # cyclopts exits with the command's status
        policy_cycle.app(["--runs", "2", "--scales", "1,2", "--gc", "freeze", "-o", "json"])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["results"]
    assert [(r["scale"], r["cycle"]) for r in rows] == [
        (1, "burst"),
        (1, "settled"),
        (2, "burst"),
        (2, "settled"),
    ]
    assert [r["nodes"] for r in rows] == [4, 4, 8, 8]
    assert all(r["growth_p50"] > 0 for r in rows)
    assert doc["gc"] == "freeze"


@pytest.mark.nats
async def test_replay_bench_runs_on_a_small_log() -> None:
    figures = await replay.run(3000, 1000, Console(quiet=True))
    assert figures.snapshot_bytes > 0 and figures.events_per_s > 0


@pytest.mark.nats
@pytest.mark.slow
async def test_pipeline_bench_runs_a_few_jobs() -> None:
    figures = await pipeline.run(jobs=40, nodes=4, clients=2, gpus_per_node=8)
    assert figures.jobs == 40 and figures.jobs_per_s > 0
    assert figures.latency_p50_ms <= figures.latency_p99_ms
    assert set(figures.cpu_ms_per_job) >= {"nats-server", "scheduler", "admission"}


@pytest.mark.nats
async def test_memory_bench_runs_on_a_small_log() -> None:
    fairlane = await nats_memory.measure("fairlane", 2000, settle_s=0.1)
    few = await nats_memory.measure("few-subjects", 2000, settle_s=0.1)
    assert fairlane.events == 2000 and fairlane.rss_after_mib > 0
    assert few.subjects == 8 and fairlane.subjects > few.subjects
