"""The benchmarks still run (at tiny sizes); their figures are reported, never asserted."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from bench import nats_memory, pipeline, policy_cycle, replay
from bench.policy_cycle import Size
from events.model import SchedulerType


def test_bench_measures_a_tiny_cluster() -> None:
    burst, settled = policy_cycle.measure([1], runs=2, base=Size(nodes=8, running=30, pending=60))
    assert burst.decisions > 0  # the state as built is off its shares
    assert settled.decisions == 0  # settled means the policy has nothing more to do
    assert 0 < burst.p50_ms <= burst.p99_ms


@pytest.mark.parametrize("scheduler", ["priority", "round_robin"])
def test_bench_builds_for_every_scheduler(scheduler: SchedulerType) -> None:
    (burst,) = policy_cycle.measure(
        [1], runs=1, base=Size(nodes=4, running=10, pending=20), settled=False, scheduler=scheduler
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


@pytest.mark.nats
@pytest.mark.slow
async def test_pipeline_bench_measures_latency_at_a_fixed_offered_load() -> None:
    figures = await pipeline.run(
        jobs=10, nodes=4, clients=2, gpus_per_node=8, rates=(20.0,), open_s=1.0
    )
    (load,) = figures.open_loop
    assert load.offered_per_s == 20.0 and load.jobs == 20
    # what the bench measured: the sender's pace, starts per second, latency (a start comes
    # after its submission)
    assert load.sent_per_s > 0 and load.started_per_s > 0
    assert 0 < load.latency_p50_ms <= load.latency_p99_ms <= load.latency_max_ms


def test_open_loop_figures_come_from_the_timestamps() -> None:
    ids = [f"o0-{i}" for i in range(11)]
    submitted = {j: 100.0 + i * 0.1 for i, j in enumerate(ids)}  # 10 a second for 1 s
    starts = pipeline.Starts()
    for i, j in enumerate(ids):
        starts.record(j, submitted[j] + (0.5 if i == 10 else 0.05))  # the last one waits
    load = pipeline.open_loop_figures(10.0, ids, submitted, starts)
    assert load.sent_per_s == 10.0
    assert load.latency_p50_ms == 50.0 and load.latency_max_ms == 500.0
    assert load.started_per_s == round(11 / 1.5, 1)  # first submission to last start


@pytest.mark.parametrize("text", ["200,fast", "0", "-5", "1e9"])
def test_pipeline_bench_refuses_a_bad_rate(text: str) -> None:
    with pytest.raises(ValueError, match="--rates"):
        pipeline.parse_rates(text)
