"""Simulator figures on workloads small enough to check by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import CheckpointModel, JobPreempted
from events.model import VictimOrder
from events.units import percentile
from simulation.trace.cluster import uniform_cluster
from simulation.trace.policies import PolicyName, make_policy
from simulation.trace.run import CycleMode, Options, Outcome, Simulation
from simulation.trace.traces import TraceJob
from simulation.trace.workload import largest_remainder, shape


def run(
    jobs: list[TraceJob],
    *,
    nodes: int = 1,
    gpus: int = 4,
    policy: PolicyName = "fifo",
    victim_order: VictimOrder = "newest",
    checkpoint: CheckpointModel | None = None,
    cycles: CycleMode = "event",
    round_s: float = 360.0,
    quotas: Path | None = None,
    las: tuple[float, ...] = (1.0, 10.0),
) -> tuple[Outcome, Simulation]:
    options = Options(
        policy=make_policy(policy, las),
        victim_order=victim_order,
        checkpoint=checkpoint,
        cycles=cycles,
        round_s=round_s,
    )
    sim = Simulation(jobs, uniform_cluster(nodes, gpus), options, quotas, keep_log=True)
    return sim.run(), sim


def test_two_jobs_on_one_node_exact_figures() -> None:
    # j1 takes the whole node 0..100; j2 (arrives at 10) waits for it and runs 100..150
    outcome, _ = run([TraceJob("j1", 0, 100, 4, "a"), TraceJob("j2", 10, 50, 2, "a")])
    s = outcome.summary
    assert sorted(outcome.jct_s) == [100.0, 140.0]
    assert (s.jobs_completed, s.avg_jct_s, s.p99_jct_s) == (2, 120.0, 140.0)
    assert (s.avg_queue_s, s.p99_queue_s, s.avg_wait_s) == (45.0, 90.0, 45.0)
    assert s.makespan_s == 150.0
    assert s.utilization == pytest.approx((4 * 100 + 2 * 50) / (4 * 150))
    assert (s.preemptions, s.gpu_hours_lost) == (0, 0.0)
    assert s.gpu_hours_held == pytest.approx(500 / 3600)
    # one project, always entitled to what it asked for: exactly its fair share
    assert s.projects["a"].fair_share_ratio == pytest.approx(1.0)


def test_queue_and_busy_series_are_step_functions() -> None:
    outcome, _ = run([TraceJob("j1", 0, 100, 4, "a"), TraceJob("j2", 10, 50, 2, "a")])
    series = outcome.series
    steps = list(zip(series.time, series.busy_gpus, series.waiting_jobs, strict=True))
    assert steps == [(0.0, 4, 0), (10.0, 4, 1), (100.0, 2, 0), (150.0, 0, 0)]


def test_rejected_jobs_are_counted_with_the_reason() -> None:
    outcome, _ = run([TraceJob("big", 0, 10, 16, "a"), TraceJob("ok", 0, 10, 4, "a")], nodes=2)
    s = outcome.summary
    assert (s.jobs_submitted, s.jobs_completed, s.jobs_rejected) == (2, 1, 1)
    (reason,) = s.rejected_reasons
    assert "can never fit" in reason


def cost_vs_newest(order: VictimOrder, tmp_path: Path) -> tuple[Outcome, Simulation]:
    """a1 starts at 0 and a2 at 50 (both 2 GPUs, checkpoint every 100 s); b's job arrives at
    210 and reclaims 2 GPUs. a1 saved at 200 (10 s unsaved), a2 at 150 (60 s unsaved)."""
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("a: 2\nb: 2\n")
    jobs = [
        TraceJob("a1", 0, 10_000, 2, "a"),
        TraceJob("a2", 50, 10_000, 2, "a"),
        TraceJob("b1", 210, 100, 2, "b"),
    ]
    cp = CheckpointModel(every_s=100, save_s=0, restore_s=0)
    return run(jobs, policy="fair_share", victim_order=order, checkpoint=cp, quotas=quotas)


def test_newest_victim_loses_more_work_than_the_cheapest(tmp_path: Path) -> None:
    newest, sim_n = cost_vs_newest("newest", tmp_path)
    cost, sim_c = cost_vs_newest("cost", tmp_path)
    victims = {
        order: [e.job_id for e in sim.vc.log if isinstance(e, JobPreempted)]
        for order, sim in (("newest", sim_n), ("cost", sim_c))
    }
    assert victims == {"newest": ["a2"], "cost": ["a1"]}
    assert newest.summary.gpu_hours_lost == pytest.approx(60 * 2 / 3600)
    assert cost.summary.gpu_hours_lost == pytest.approx(10 * 2 / 3600)
    # b1 runs 210..310; the victim resumes at 310 from its last checkpoint
    done = {
        order: {j: r.finished for j, r in sim.recorder.jobs.items()}
        for order, sim in (("newest", sim_n), ("cost", sim_c))
    }
    assert done["newest"] == {"a1": 10_000, "a2": 310 + 9_900, "b1": 310}
    assert done["cost"] == {"a1": 310 + 9_800, "a2": 10_050, "b1": 310}


def test_round_cycles_start_work_at_the_boundary() -> None:
    # the virtual clock starts at the first submission; the first boundary is at 100 s
    jobs = [TraceJob("j0", 1000, 50, 1, "a"), TraceJob("j1", 1010, 50, 1, "a")]
    outcome, sim = run(jobs, cycles="round", round_s=100)
    assert {j: r.first_start for j, r in sim.recorder.jobs.items()} == {"j0": 100, "j1": 100}
    assert sorted(outcome.jct_s) == [140.0, 150.0]


def test_srtf_lets_the_short_job_preempt_the_long_one() -> None:
    jobs = [TraceJob("long", 0, 1000, 4, "a"), TraceJob("short", 10, 100, 4, "a")]
    fifo, _ = run(jobs, policy="fifo")
    srtf, sim = run(jobs, policy="srtf")
    assert fifo.summary.preemptions == 0 and sorted(fifo.jct_s) == [1000, 1090]
    # no checkpoints: the long job starts over at 110
    assert srtf.summary.preemptions == 1
    assert {j: r.finished for j, r in sim.recorder.jobs.items()} == {"long": 1110, "short": 110}


def test_las_demotes_a_job_that_has_held_gpus() -> None:
    # 0.01 GPU-hours = 36 GPU-seconds: the 4-GPU job passes it after 9 s; at the first round
    # boundary (60 s) its priority drops to -1, so the newcomer at 100 s preempts it.
    jobs = [TraceJob("old", 0, 1000, 4, "a"), TraceJob("new", 100, 50, 4, "a")]
    outcome, sim = run(jobs, policy="las", round_s=60, las=(0.01,))
    assert outcome.summary.priority_changes >= 1
    assert [e.job_id for e in sim.vc.log if isinstance(e, JobPreempted)] == ["old"]
    assert sim.recorder.jobs["new"].finished == 150


def test_gangs_and_padding() -> None:
    jobs = [TraceJob(f"j{g}", 0, 1, g, "a") for g in (1, 8, 9, 12, 128)]
    shaped, padded = shape(jobs, node_gpus=8)
    assert [(j.replicas, j.gpus) for j in shaped] == [(1, 1), (1, 8), (2, 5), (2, 6), (16, 8)]
    assert padded == 1


def test_quotas_by_largest_remainder() -> None:
    assert largest_remainder({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert largest_remainder({"a": 2.0, "b": 1.0}, 7) == {"a": 5, "b": 2}
    shares = largest_remainder({"x": 0.31, "y": 0.3, "z": 0.39}, 64)
    assert sum(shares.values()) == 64


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 0.99), percentile(values, 0.5)) == (99, 50)
    assert percentile([5.0], 0.99) == 5.0 and percentile([], 0.99) == 0.0


def test_fairness_is_gpu_hours_held_against_the_fair_share(tmp_path: Path) -> None:
    # fifo never preempts: a keeps all 4 GPUs 0..100 although b is entitled to 2 from 10 on
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("a: 2\nb: {quota: 2, over_quota_weight: 1}\n")
    jobs = [TraceJob("a1", 0, 100, 4, "a"), TraceJob("b1", 10, 10, 4, "b")]
    outcome, _ = run(jobs, policy="fifo", quotas=quotas)
    a, b = outcome.summary.projects["a"], outcome.summary.projects["b"]
    # fair shares: a 4 on [0,10), 2 and 2 on [10,100), b 4 on [100,110)
    assert a.fair_share_gpu_hours * 3600 == pytest.approx(4 * 10 + 2 * 90)
    assert b.fair_share_gpu_hours * 3600 == pytest.approx(2 * 90 + 4 * 10)
    assert (a.gpu_hours * 3600, b.gpu_hours * 3600) == pytest.approx((400, 40))
    lowest, jain = outcome.summary.fairness
    assert lowest == pytest.approx(40 / 220)
    assert jain == pytest.approx((440 / 220) ** 2 / (2 * ((400 / 220) ** 2 + (40 / 220) ** 2)))
