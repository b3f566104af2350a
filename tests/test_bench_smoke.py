"""The benchmarks still run (at tiny sizes); their figures are reported, never asserted."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from rich.console import Console

from bench import hollow_cluster, live_tail, nats_memory, pipeline, policy_cycle, replay
from bench.pipeline import SERVICES
from bench.policy_cycle import Size
from bench.revision import ROOT
from events import JobCompleted, JobScheduled, JobStarted, Replica
from events.model import SchedulerType
from policy.state import ClusterState
from services.runtime.eventlog import Stored


def test_bench_measures_a_tiny_cluster() -> None:
    burst, settled = policy_cycle.measure([1], runs=2, base=Size(nodes=8, running=30, pending=60))
    assert burst.decisions > 0  # the state as built is off its shares
    assert settled.decisions == 0  # settled means the policy has nothing more to do
    assert 0 < burst.p50_ms <= burst.p99_ms
    assert burst.cpu_p50_ms > 0  # the process's own CPU time, besides the wall clock's
    # what building took, and the memory of the build, the state and one cycle
    assert burst.build_s > 0 and settled.build_s > 0
    assert burst.state_mib is not None and burst.build_peak_mib is not None
    assert 0 < burst.state_mib <= burst.build_peak_mib
    assert burst.cycle_peak_mib is not None and burst.cycle_peak_mib > 0


def test_policy_bench_measures_no_memory_when_told_not_to() -> None:
    (burst,) = policy_cycle.measure(
        [1], runs=1, base=Size(nodes=4, running=10, pending=20), settled=False, memory=False
    )
    assert burst.build_s > 0
    assert (burst.build_peak_mib, burst.state_mib, burst.cycle_peak_mib) == (None, None, None)


def test_policy_bench_times_restored_states_deciding_as_built() -> None:
    """`--restored` decides on each state as a restarted service has it: the same plans."""
    base = Size(nodes=8, running=30, pending=60)
    built = policy_cycle.measure([1], runs=1, base=base, memory=False)
    restored = policy_cycle.measure([1], runs=1, base=base, memory=False, restored=True)
    assert [f.plan_sha256 for f in restored] == [f.plan_sha256 for f in built]
    assert [f.decisions for f in restored] == [f.decisions for f in built]


def idle_gpus(state: ClusterState) -> int:
    held = sum(len(r.gpus) for job in state.jobs.values() for r in job.held)
    return sum(node.gpus for node in state.nodes.values()) - held


@pytest.mark.parametrize("seed", [1, 3, 7])
def test_policy_bench_scales_the_same_cluster(seed: int) -> None:
    """Twice the size leaves twice the GPUs idle: the same mix of jobs at every size. Drawn
    one by one, the idle GPUs (what 5,000 random jobs leave of 8,000) grew 1.7x to 2.4x,
    and with them the share of the queue the cycle preempts for."""
    one, two = (policy_cycle.build(policy_cycle.BASE.times(s), seed).state for s in (1, 2))
    assert 1.9 <= idle_gpus(two) / idle_gpus(one) <= 2.1


def test_deck_deals_in_proportion() -> None:
    deck = policy_cycle.Deck(random.Random(5), (("a", 3), ("b", 1)))
    drawn = [deck.draw() for _ in range(40)]
    for start in range(0, 40, 4):  # every round deals each value its count of times
        assert sorted(drawn[start : start + 4]) == ["a", "a", "a", "b"]
    assert len({tuple(drawn[start : start + 4]) for start in range(0, 40, 4)}) > 1  # shuffled


@pytest.mark.parametrize("text", ["", "1,x", "0", "2,101", "-1"])
def test_policy_bench_refuses_a_bad_scale(text: str) -> None:
    with pytest.raises(ValueError, match="--scales"):
        policy_cycle.parse_scales(text)


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
    assert all(r["growth_p50"] > 0 and r["cpu_growth_p50"] > 0 for r in rows)
    assert doc["gc"] == "freeze"


@pytest.mark.nats
async def test_replay_bench_runs_on_a_small_log() -> None:
    figures = await replay.run(3000, 1000, Console(quiet=True))
    assert figures.snapshot_bytes > 0 and figures.events_per_s > 0


@pytest.mark.nats
async def test_live_tail_bench_reads_a_short_tail_in_a_process_of_its_own() -> None:
    reading = await live_tail.one_run(ROOT, events=300, rate=3000, burst=5, what="now")
    assert reading.live_cpu_ms_per_1000 > 0 and reading.replay_cpu_ms_per_1000 > 0
    assert reading.live_wall_s > 0


@pytest.mark.nats
async def test_memory_bench_runs_on_a_small_log() -> None:
    fairlane = await nats_memory.measure("fairlane", 2000, settle_s=0.1)
    few = await nats_memory.measure("few-subjects", 2000, settle_s=0.1)
    assert fairlane.events == 2000 and fairlane.rss_after_mib > 0
    assert few.subjects == 8 and fairlane.subjects > few.subjects


@pytest.mark.nats
@pytest.mark.slow
async def test_pipeline_bench_runs_a_few_jobs_then_a_fixed_offered_load() -> None:
    """One cluster for both loops (each run starts its own servers and services)."""
    figures = await pipeline.run(
        jobs=40, nodes=4, clients=2, gpus_per_node=8, rates=(20.0,), open_s=1.0, raw_events=500
    )
    assert figures.jobs == 40 and figures.jobs_per_s > 0
    assert figures.latency_p50_ms <= figures.latency_p99_ms
    assert set(figures.cpu_ms_per_job) >= {"nats-server", "scheduler", "admission"}
    assert figures.raw_publish_per_s > 0 and figures.raw_publish_batched_per_s > 0
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


@pytest.mark.nats
async def test_hollow_cluster_bench_checks_its_run_on_three_servers() -> None:
    figures = await hollow_cluster.run(nodes=20, jobs=50, clients=2, runtime_s=0.1)
    assert figures.checks.ok, figures.checks
    assert figures.checks.completed_once == 50
    assert figures.servers == 3 and figures.replicas == 3  # the stream, as the cluster says
    assert 0 < figures.latency_p50_ms <= figures.latency_p99_ms and figures.jobs_per_s > 0
    peaks = figures.peak_rss_mib
    assert set(peaks) >= {"nats-1", "nats-2", "nats-3", *SERVICES}
    assert all(mib is not None and mib > 0 for mib in peaks.values())


def _stored(*events: JobScheduled | JobStarted | JobCompleted) -> list[Stored]:
    return [Stored(seq, e) for seq, e in enumerate(events, 1)]


def test_hollow_cluster_checks_catch_a_double_completion_and_a_gpu_taken_twice() -> None:
    gpu = (Replica(node="n0", gpus=(0,)),)

    def placed(job: str) -> JobScheduled:
        return JobScheduled(
            id=f"{job}/s", time=0.0, actor="t", job_id=job, attempt=1, pool="default", replicas=gpu
        )

    def started(job: str) -> JobStarted:
        return JobStarted(id=f"{job}/r", time=0.0, actor="t", job_id=job, attempt=1)

    def completed(job: str, attempt: int = 1) -> JobCompleted:
        return JobCompleted(
            id=f"{job}/{attempt}/c", time=0.0, actor="t", job_id=job, attempt=attempt
        )

    fine = _stored(placed("a"), started("a"), completed("a"), placed("b"), started("b"))
    fine += _stored(completed("b"))
    assert hollow_cluster.check(["a", "b"], fine).ok
    again = _stored(placed("a"), started("a"), completed("a"), completed("a", 2))
    twice = hollow_cluster.check(["a"], again)
    assert not twice.ok and twice.not_once == ["a: completed 2 times"]
    never = hollow_cluster.check(["a", "b"], _stored(placed("a"), started("a"), completed("a")))
    assert not never.ok and never.not_once == ["b: completed 0 times"]
    shared = hollow_cluster.check(
        ["a", "b"],
        _stored(
            placed("a"), started("a"), placed("b"), started("b"), completed("a"), completed("b")
        ),
    )
    assert shared.completed_once == 2 and not shared.ok
    assert shared.gpu_problems == ["seq 4: GPU ('n0', 0) held by ('a', 1) and ('b', 1)"]


@pytest.mark.parametrize(
    ("flag", "values"),
    [
        ("--nodes", (0, 50, 2, 1.0)),
        ("--jobs", (20, 0, 2, 1.0)),
        ("--clients", (20, 5, 6, 1.0)),
        ("--runtime", (20, 50, 2, 0.0)),
    ],
)
def test_hollow_cluster_bench_refuses_a_bad_flag(
    flag: str, values: tuple[int, int, int, float]
) -> None:
    with pytest.raises(ValueError, match=flag):
        hollow_cluster.validate(*values)


def _figures(jobs_per_s: float, cpu: dict[str, float], p50: float) -> pipeline.Figures:
    load = pipeline.OpenLoop(500.0, 10, 500.0, 490.0, p50, p50, p50)
    return pipeline.Figures(
        jobs=10,
        nodes=2,
        clients=1,
        jobs_per_s=jobs_per_s,
        latency_p50_ms=p50,
        latency_p99_ms=p50,
        raw_publish_per_s=1.0,
        raw_publish_batched_per_s=1.0,
        ratio_to_raw=1.0,
        ratio_to_raw_batched=1.0,
        cpu_ms_per_job=cpu,
        cpu_ms_per_job_total=sum(cpu.values()),
        open_loop=[load],
    )


def test_pipeline_against_a_baseline_gives_the_ratios() -> None:
    before = _figures(200.0, {"nats-server": 0.8, "scheduler": 0.6}, 80.0)
    after = _figures(500.0, {"nats-server": 0.4, "scheduler": 0.6}, 20.0)
    result = pipeline.paired("main", before, after)
    assert result.jobs_per_s_ratio == 2.5
    assert result.cpu_ratio == {"nats-server": 2.0, "scheduler": 1.0, "total": 1.4}
    assert result.latency_p50_ratio == 4.0 and result.open_loop_p50_ratio == {"500": 4.0}


def test_pipeline_against_no_revision_says_so() -> None:
    with pytest.raises(ValueError, match="--baseline: 'no-such-revision'"):
        pipeline.against("no-such-revision", {"jobs": 1})


@pytest.mark.parametrize(
    ("bench", "args", "said"),
    [
        ("pipeline", ["--open-s", "0"], "--open-s must be above 0"),
        ("pipeline", ["--rates", "abc"], "--rates: 'abc'"),
        ("policy_cycle", ["--scales", "0"], "--scales: '0'"),
        ("hollow_cluster", ["--nodes", "0"], "--nodes must be from 1"),
    ],
)
def test_a_bench_given_a_bad_option_says_which_and_exits_2(
    bench: str, args: list[str], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
