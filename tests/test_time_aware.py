"""Rule 11, time-aware fairness: the decayed usage the fold keeps, the division that weighs it,
the decisions that carry it, the audit that re-derives it, and the bounds of its settings."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import time_aware
from events import (
    ClusterConfigured,
    ClusterSettings,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    PoolConfigured,
    PreemptionFacts,
    ProjectTerms,
    SchedulerSettings,
    decode_event,
    encode_event,
)
from events.commands import ConfigureCluster, SetPool
from events.export import export_line, read_export
from events.model import UsageFacts
from fairlane.audit_cli import Log
from fairlane.timeline import details
from fairlane.whatif_cli import compare, parse_usage
from policy.audit import audit
from policy.commands import Refused
from policy.commands.config import configure_cluster, set_pool
from policy.cycle import decide, next_wakeup
from policy.decay import Decayed, PoolUsage, settings_problem
from policy.division import Claim, History, divide
from policy.snapshot import decode_snapshot, encode_snapshot
from policy.state import ClusterState
from projections.projection import Projection
from simulation.spec import ScenarioError, parse_scenario
from simulation.trace.errors import SimulationError
from simulation.trace.scenario import run_scenario
from simulation.virtual_cluster import VirtualCluster
from tests.test_policy_golden import RANDOM_CASES, random_case

HISTORIES = sorted((Path(__file__).parent / "histories" / "in_process").glob("*.jsonl"))
POOL = "default"


# -- the fold: the closed form is the sum over the history ------------------------------------


jobs = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),  # project
        st.sampled_from([1, 2, 4, 8]),  # GPUs
        st.floats(60.0, 4 * 3600.0),  # duration
        st.floats(0.0, 3 * 3600.0),  # submitted this long after the one before
    ),
    min_size=1,
    max_size=12,
)


def run_cluster(
    half_life_s: float, k: float, work: list[tuple[str, int, float, float]], nodes: int = 2
) -> VirtualCluster:
    vc = VirtualCluster()
    vc.configure(
        ClusterConfigured(
            id="config",
            time=0.0,
            actor="t",
            settings=ClusterSettings(
                scheduler=SchedulerSettings(usage_half_life_s=half_life_s, usage_k=k)
            ),
        )
    )
    for n in range(nodes):
        vc.add_node(f"n{n}", POOL, 8)
    for project in ("a", "b", "c"):
        vc.set_project(project, {POOL: ProjectTerms()})
    vc.settle()
    for i, (project, gpus, duration, after) in enumerate(work):
        vc.advance(after)
        vc.submit(f"j{i}", JobSpec(project=project, gpus=gpus, duration_s=duration))
        vc.settle()
    vc.advance(3600.0)
    return vc


def summed_over_history(vc: VirtualCluster, t: float) -> tuple[dict[str, float], float]:
    """Each project's decayed GPU-seconds, and the pool's, at t: the log folded again event by
    event, what every project holds read from who owns each GPU after every event, and each
    stretch between events integrated on its own (no accumulator carried along)."""
    h = vc.state.pool_settings(POOL).usage_half_life_s
    assert h is not None
    state = ClusterState()
    stretches: list[tuple[float, dict[str, int], int]] = []
    for event in vc.log:
        state.apply(event)
        held: dict[str, int] = {}
        for owners in state.owners.values():
            for job_id in owners.values():
                project = state.jobs[job_id].project
                held[project] = held.get(project, 0) + 1
        capacity = sum(n.gpus for n in state.nodes.values())
        stretches.append((state.last_time, held, capacity))

    def weight(t0: float, t1: float) -> float:  # the integral of 2^-((t - s)/h) over [t0, t1]
        return h / math.log(2) * (2 ** (-(t - t1) / h) - 2 ** (-(t - t0) / h))

    projects: dict[str, float] = {}
    pool = 0.0
    ends = [s[0] for s in stretches[1:]] + [t]
    for (start, held, capacity), end in zip(stretches, ends, strict=True):
        pool += capacity * weight(start, end)
        for project, gpus in held.items():
            projects[project] = projects.get(project, 0.0) + gpus * weight(start, end)
    return projects, pool


@settings(max_examples=25, deadline=None)
@given(half_life=st.floats(600.0, 6 * 3600.0), work=jobs)
def test_the_fold_keeps_the_decayed_usage_of_the_whole_history(
    half_life: float, work: list[tuple[str, int, float, float]]
) -> None:
    vc = run_cluster(half_life, 1.0, work)
    usage = vc.state.usage[POOL]
    t = vc.now + 1234.5  # between events: exact there too
    projects, pool = summed_over_history(vc, t)
    assert usage.capacity.at(t, half_life) == pytest.approx(pool, rel=1e-9)
    for project, value in projects.items():
        assert usage.projects[project].at(t, half_life) == pytest.approx(value, rel=1e-9, abs=1e-6)
    shares = usage.shares(t)
    assert all(0.0 <= u <= 1.0 for u in shares.values())
    assert sum(shares.values()) <= 1.0 + 1e-5
    for project, u in shares.items():
        assert u == pytest.approx(projects.get(project, 0.0) / pool, abs=1e-6)


disturbances = st.lists(
    st.tuples(
        st.sampled_from(["pause", "resume", "cancel", "lose", "add", "half_life", "wait"]),
        st.integers(0, 11),  # which job or node
        st.floats(0.0, 7200.0),  # how long after the one before
    ),
    max_size=10,
)


@settings(max_examples=25, deadline=None)
@given(work=jobs, events=disturbances)
def test_u_stays_in_0_1_and_exact_through_pauses_lost_nodes_and_a_new_half_life(
    work: list[tuple[str, int, float, float]], events: list[tuple[str, int, float]]
) -> None:
    vc = run_cluster(3600.0, 1.0, work, nodes=3)
    added = 0
    for kind, which, after in events:
        vc.advance(after)
        job_id = f"j{which % len(work)}"
        if kind in ("pause", "resume", "cancel"):
            getattr(vc, kind)(job_id)
        elif kind == "lose" and f"n{which % 3}" in vc.state.nodes:
            vc.remove_node(f"n{which % 3}")
        elif kind == "add":
            vc.add_node(f"m{added}", POOL, 4)
            added += 1
        elif kind == "half_life":  # the half-life changes: every value carries on
            before = vc.state.usage[POOL].shares(vc.now)
            vc.add_pool(POOL, _pool_setting(1800.0 + which * 600.0, vc.now))
            assert vc.state.usage[POOL].shares(vc.now) == before
        vc.settle()
        shares = vc.state.usage[POOL].shares(vc.now + after)
        assert all(0.0 <= u <= 1.0 for u in shares.values())
        assert sum(shares.values()) <= 1.0 + 1e-5
    if not any(kind == "half_life" for kind, _, _ in events):
        usage = vc.state.usage[POOL]
        t = vc.now + 600.0
        projects, pool = summed_over_history(vc, t)
        assert usage.capacity.at(t, usage.half_life_s) == pytest.approx(pool, rel=1e-9)
        for project, value in projects.items():
            at = usage.projects[project].at(t, usage.half_life_s)
            assert at == pytest.approx(value, rel=1e-9, abs=1e-6)


def _pool_setting(half_life_s: float, now: float) -> PoolConfigured:
    return PoolConfigured(
        id=f"pool/{half_life_s}/{now}",
        time=now,
        actor="t",
        pool=POOL,
        scheduler=SchedulerSettings(usage_half_life_s=half_life_s),
    )


def test_decay_halves_per_half_life_and_fills_towards_the_gpus_held() -> None:
    acc = Decayed(value=1000.0, as_of=0.0, gpus=0)
    assert acc.at(3600.0, 3600.0) == pytest.approx(500.0)
    held = Decayed(value=0.0, as_of=0.0, gpus=4)
    # always held: 4 GPUs times the whole weight up to now, h / ln 2 (1 - 2^-n)
    assert held.at(7200.0, 3600.0) == pytest.approx(4 * 3600.0 / math.log(2) * 0.75)
    assert held.at(-5.0, 3600.0) == 0.0  # never extrapolated backwards


def test_changing_the_half_life_carries_the_usage_on_without_a_jump() -> None:
    pool = PoolUsage(3600.0, Decayed(0.0, 0.0, 8), {"a": Decayed(0.0, 0.0, 8)})
    assert pool.shares(1800.0) == {"a": 1.0}
    pool.projects["a"].move(1800.0, 3600.0, -8)
    before = pool.shares(5400.0)
    pool.retune(5400.0, 600.0)
    assert pool.shares(5400.0) == before
    assert pool.shares(9000.0)["a"] < before["a"]  # and decays faster from then on


def test_snapshot_keeps_the_decayed_usage() -> None:
    vc = run_cluster(1800.0, 1.0, [("a", 8, 7200.0, 0.0), ("b", 8, 7200.0, 600.0)])
    state, seq = decode_snapshot(encode_snapshot(vc.state, 7))
    assert seq == 7
    assert state.usage == vc.state.usage
    assert decide(state, vc.now + 60) == decide(vc.state, vc.now + 60)


# -- the division ---------------------------------------------------------------------------


@st.composite
def divisions(draw: st.DrawFn) -> tuple[int, list[Claim], dict[str, float], float]:
    n = draw(st.integers(1, 5))
    claims = [
        Claim(
            project=f"p{i}",
            order=i,
            quota=draw(st.integers(0, 8)),
            weight=draw(st.integers(0, 3)),
            priority=draw(st.sampled_from([50, 100, 100, 200])),
            demand=draw(st.integers(0, 24)),
        )
        for i in range(n)
    ]
    raw = [draw(st.floats(0.0, 1.0)) for _ in range(n)]
    scale = draw(st.floats(0.0, 1.0)) / max(1.0, sum(raw))
    usage = {c.project: round(u * scale, 6) for c, u in zip(claims, raw, strict=True)}
    k = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 100.0]))
    return draw(st.integers(0, 48)), claims, usage, k


@settings(max_examples=300, deadline=None)
@given(case=divisions())
def test_the_history_moves_the_shares_above_quota_only(
    case: tuple[int, list[Claim], dict[str, float], float],
) -> None:
    capacity, claims, usage, k = case
    plain = divide(capacity, claims)
    weights: dict[str, Fraction] = {}
    shares = divide(capacity, claims, History(usage, k), weights)
    # the shares still add up as before: only who gets what above quota changes
    assert sum(shares.values()) == sum(plain.values())
    for c in claims:
        assert min(c.quota, c.demand) <= shares[c.project] <= max(c.demand, 0)
        if c.weight == 0:
            assert shares[c.project] == min(c.quota, c.demand)
        if c.project in weights:
            assert weights[c.project] >= 0
    # strict priority holds: a level gets nothing above quota while a higher one is short
    for hi in claims:
        if shares[hi.project] < hi.demand and hi.weight > 0:
            for lo in claims:
                if lo.priority < hi.priority:
                    assert shares[lo.project] == min(lo.quota, lo.demand)
    if k == 0:
        assert shares == plain


def test_a_heavy_past_user_gets_the_smaller_share() -> None:
    claims = [Claim("a", 0, 0, 1, 100, 16), Claim("b", 1, 0, 1, 100, 16)]
    weights: dict[str, Fraction] = {}
    shares = divide(16, claims, History({"a": 0.2, "b": 0.0}, 1.0), weights)
    # P_a = 0.5 + (0.5 - 0.2) = 0.8, P_b = 1: 16 * 0.8 / 1.8 = 7.1 and 8.9
    assert weights == {"a": Fraction(0.5) + (Fraction(0.5) - Fraction(0.2)), "b": Fraction(1)}
    assert shares == {"a": 7, "b": 9}
    assert divide(16, claims) == {"a": 8, "b": 8}


# -- the policy: off or k = 0 is today's; on, the decisions it moved say so ------------------


def test_k_zero_decides_exactly_as_without_a_half_life() -> None:
    for seed in range(RANDOM_CASES):
        assert list(random_case(seed, (1800.0, 0.0))) == list(random_case(seed)), seed


def test_with_a_half_life_the_decisions_it_moved_carry_u_and_p() -> None:
    runs_moved = carried = shares_moved = 0
    for seed in range(RANDOM_CASES):
        on = [e for step in random_case(seed, (600.0, 1.0)) for e in step]
        off = [e for step in random_case(seed) for e in step]
        runs_moved += on != off
        for e in on:
            if isinstance(e, JobPreemptionRequested):
                history = e.facts.history if e.facts is not None else None
                if history is not None:  # the projects it involves, as the other facts
                    assert e.facts is not None
                    assert history.fair_share.keys() == e.facts.fair_share.keys()
            elif isinstance(e, JobScheduled | JobNominated):
                history = e.history
            else:
                history = None
            if history is not None:
                carried += 1
                assert history.fair_share.keys() == history.without_history.keys()
                assert all(0.0 <= u <= 1.0 for u in history.decayed_usage.values())
                shares_moved += history.fair_share != history.without_history
    assert runs_moved > 0
    assert carried > 0
    assert shares_moved > 0


def test_while_a_job_waits_the_policy_looks_again_as_shares_move() -> None:
    vc = run_cluster(3600.0, 1.0, [("a", 8, 36000.0, 0.0), ("a", 8, 36000.0, 0.0)], nodes=1)
    assert next_wakeup(vc.state, vc.now) == pytest.approx(vc.now + 3600.0 / 64)
    off = run_cluster(3600.0, 1.0, [("a", 8, 100.0, 0.0)], nodes=1)
    assert next_wakeup(off.state, off.now) is None  # nothing waits: nothing to look at


# -- the audit --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_a_log_recorded_with_a_half_life_audits_clean_with_every_u(path: Path) -> None:
    log = list(read_export(path.read_bytes().splitlines()))
    report = audit(log)
    assert report.findings == []
    assert report.matched == report.checked > 0
    assert report.usage_checked == report.usage_matched > 0


def test_the_audit_finds_a_u_that_the_log_does_not_give() -> None:
    path = next(p for p in HISTORIES if p.stem == "time-aware-reclaim")
    log = list(read_export(path.read_bytes().splitlines()))
    tampered = [
        (seq, _other_u(e)) if isinstance(e, JobNominated) and e.history is not None else (seq, e)
        for seq, e in log
    ]
    lines = b"".join(export_line(seq, e) for seq, e in tampered)
    report = audit(list(read_export(lines.splitlines())))
    assert report.usage_checked > report.usage_matched
    assert {f.outcome for f in report.mismatches} == {"differs"}
    assert all(isinstance(f.decision, JobNominated) for f in report.mismatches)


def _other_u(e: JobNominated) -> JobNominated:
    assert e.history is not None
    usage = {p: round(u * 0.9, 6) for p, u in e.history.decayed_usage.items()}
    history: UsageFacts = msgspec.structs.replace(e.history, decayed_usage=usage)
    return msgspec.structs.replace(e, history=history)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("half_life", "k", "named"),
    [
        (-60.0, 1.0, "-60.0"),
        (0.0, 1.0, "0.0"),
        (20 * 365 * 86400.0, 1.0, "630720000.0"),
        (math.inf, 1.0, "inf"),
        (3600.0, -1.0, "-1.0"),
        (3600.0, 1000.0, "1000.0"),
        (3600.0, math.nan, "nan"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(half_life: float, k: float, named: str) -> None:
    problem = settings_problem(half_life, k)
    assert problem is not None and named in problem
    assert ("usage_k" if half_life == 3600.0 else "usage_half_life") in problem
    scheduler = SchedulerSettings(usage_half_life_s=half_life, usage_k=k)
    state = ClusterState()
    for outcome in (
        set_pool(state, SetPool(pool="gpu", scheduler=scheduler), 0.0, 1),
        configure_cluster(state, ConfigureCluster(scheduler=scheduler), 0.0, 1),
    ):
        assert isinstance(outcome, Refused)
        assert named in outcome.reason


def test_good_settings_are_accepted() -> None:
    assert settings_problem(None, 1.0) is None
    assert settings_problem(7200.0, 0.0) is None
    outcome = set_pool(
        ClusterState(),
        SetPool(pool="gpu", scheduler=SchedulerSettings(usage_half_life_s=7200.0)),
        0.0,
        1,
    )
    assert not isinstance(outcome, Refused)


@pytest.mark.parametrize(
    ("scheduler", "named"),
    [
        ({"usage_half_life": "0s"}, "usage_half_life must be longer than 0"),
        ({"usage_half_life": "-2h"}, "'-2h' is not a duration"),
        ({"usage_half_life": "5000d"}, "432000000.0"),
        ({"usage_half_life": "2h", "usage_k": -1}, "usage_k must be between 0 and 100, got -1"),
        ({"usage_halflife": "2h"}, "usage_halflife"),
    ],
)
def test_a_scenario_with_bad_settings_names_the_value(
    scheduler: dict[str, object], named: str
) -> None:
    data = {
        "name": "bad",
        "pools": [{"name": "gpu", "scheduler": scheduler, "nodes": [{"name": "n0", "gpus": 8}]}],
        "steps": [{"expect": {}}],
    }
    with pytest.raises(ScenarioError, match=named.replace("(", r"\(")) as raised:
        parse_scenario(data, Path("bad.yaml"))
    assert "usage_" in str(raised.value)


def test_a_scenario_reads_the_half_life_as_a_duration() -> None:
    data = {
        "name": "ok",
        "config": {"scheduler": {"usage_half_life": "2h", "usage_k": 0.5}},
        "steps": [{"expect": {}}],
    }
    scheduler = parse_scenario(data, Path("ok.yaml")).config.scheduler
    assert scheduler is not None
    assert (scheduler.usage_half_life_s, scheduler.usage_k) == (7200.0, 0.5)


def test_decisions_without_a_half_life_carry_nothing_new() -> None:
    vc = run_cluster(1800.0, 0.0, [("a", 8, 7200.0, 0.0), ("b", 8, 7200.0, 600.0)])
    decisions = [e for e in vc.log if isinstance(e, JobScheduled | JobNominated)]
    assert decisions
    assert all(e.history is None for e in decisions)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--usage-half-life", "0s"], "--usage-half-life: usage_half_life must be"),
        (["--usage-half-life=-2h"], "'-2h' is not a duration"),
        (["--usage-half-life", "20000d"], "got 1728000000.0s"),
        (["--usage-half-life", "2h", "--usage-k", "-1"], "--usage-k: usage_k must be between"),
        (["--usage-half-life", "2h", "--usage-k", "nan"], "--usage-k: usage_k must be between"),
    ],
)
def test_pool_set_names_a_bad_value_before_asking_anyone(args: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "pool", "set", "default", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert named in said
    # the one flag at fault, not the other
    other = "--usage-half-life" if named.startswith("--usage-k") else "--usage-k"
    assert other not in said


def test_the_read_side_shows_each_projects_u() -> None:
    path = next(p for p in HISTORIES if p.stem == "time-aware-reclaim")
    projection = Projection()
    rows: dict[tuple[str, str], float | None] = {}
    for seq, event in read_export(path.read_bytes().splitlines()):
        projection.apply(seq, event)
        if seq == 40:  # b's claim decided on a's hour of holding the whole pool
            rows.update(
                {(r.project, r.pool): r.decayed_usage for r in projection.take().project_pools}
            )
            assert rows[("a", POOL)] == 1.0
            assert rows[("b", POOL)] == 0.0
    for row in projection.take().project_pools:
        assert row.decayed_usage is not None and 0.0 <= row.decayed_usage <= 1.0


# -- the simulator: a scenario as the workload, and the oscillation it measures --------------

OSCILLATION = Path(__file__).parent.parent / "bench" / "scenarios" / "oscillation.yaml"


def test_without_a_half_life_the_older_project_takes_nearly_everything() -> None:
    hours = run_scenario(OSCILLATION).gpu_hours
    assert hours["a"] / (hours["a"] + hours["b"]) > 0.95


def test_with_a_half_life_they_take_turns_and_split_within_5_percent() -> None:
    outcome = run_scenario(OSCILLATION, (7200.0, 1.0))
    hours = outcome.gpu_hours
    assert abs(hours["a"] / (hours["a"] + hours["b"]) - 0.5) < 0.05
    a = outcome.allocation.gpus["a"]
    turns = sum(1 for before, after in itertools.pairwise(a) if before != after)
    assert turns >= 10  # they alternate, not one long handover


def test_simulate_a_scenario_reports_gpu_hours_per_project(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "simulate", "--scenario", str(OSCILLATION),
         "--usage-half-life", "2h", "-o", "json", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["usage_half_life_s"] == 7200.0
    assert set(report["projects"]) == {"a", "b"}
    # running jobs counted up to the last step: the pool was busy all 24 hours
    assert sum(p["gpu_hours"] for p in report["projects"].values()) == pytest.approx(16 * 24)
    assert (tmp_path / "allocation.png").stat().st_size > 0


def test_simulate_names_a_bad_half_life() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "simulate", "--scenario", str(OSCILLATION),
         "--usage-half-life", "0s"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "got 0.0s" in done.stderr


def test_whatif_turns_the_half_life_on_for_a_recorded_log() -> None:
    log: Log = list(read_export(RECORDED.read_bytes().splitlines()))
    runs = compare(log, None, None, {}, parse_usage("2h", None))
    (base, _), (other, _) = runs.values()
    assert base["usage_half_life_s"] is None
    assert other["usage_half_life_s"] == 7200.0
    with pytest.raises(SimulationError, match=r"got -1\.0"):
        parse_usage("2h", -1.0)


RECORDED = Path(__file__).parent / "histories" / "reclaim-anti-ping-pong-claimant-first.jsonl"


def test_events_without_history_are_written_and_read_as_before() -> None:
    old = (
        b'{"type":"JobPreemptionRequested","id":"x/1/preempt/0-0","version":2,"time":5.0,'
        b'"actor":"preemptor","job_id":"x","attempt":1,"reason":"reclaim",'
        b'"facts":{"pool":"default","fair_share":{"a":8}}}'
    )
    event = decode_event(old)
    assert isinstance(event, JobPreemptionRequested)
    assert event.facts is not None and event.facts.history is None
    assert encode_event(event) == old  # nothing new is written where the history moved nothing
    placed = JobScheduled(
        id="j/1/scheduled", time=1.0, actor="scheduler", job_id="j", attempt=1, pool="p",
        replicas=(),
    )  # fmt: skip
    assert b"history" not in encode_event(placed)


def test_the_timeline_says_what_the_history_did_in_words() -> None:
    history = UsageFacts(
        half_life_s=7200.0,
        k=1.0,
        decayed_usage={"a": 0.38, "b": 0.62},
        share_weight={"a": 0.62, "b": 0.38},
        fair_share={"a": 11, "b": 5},
        without_history={"a": 8, "b": 8},
    )
    stop = JobPreemptionRequested(
        id="b1/1/preempt/0-0", time=1.0, actor="preemptor", job_id="b1", attempt=1,
        reason="reclaim", for_job="a2",
        facts=PreemptionFacts(pool=POOL, fair_share={"a": 11, "b": 5}, history=history),
    )  # fmt: skip
    entry = {"type": "JobPreemptionRequested", "event": msgspec.to_builtins(stop)}
    said = details({**entry, "reason": "reclaim", "for_job": "a2"})
    assert "project b has used 62% of the pool over the last hours (half-life 2h)" in said
    assert "its share is 5, not 8" in said
    assert "project a has used 38% of the pool" in said


def test_the_measurement_runs_and_draws(tmp_path: Path) -> None:
    off, on = run_scenario(time_aware.SCENARIO), run_scenario(time_aware.SCENARIO, (7200.0, 1.0))
    assert time_aware.handovers(off) == 0 < time_aware.handovers(on)
    time_aware.plot(off, on, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_a_scenario_s_fair_share_ratio_counts_the_running_jobs() -> None:
    """`fairlane simulate --scenario`: each project's ratio is its GPU-hours up to the last
    step (running jobs counted) over its fair share's, as its `gpu_hours` says."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "time-aware-reclaim.yaml"
    command = [sys.executable, "-m", "fairlane.cli", "simulate", "--scenario", str(scenario)]
    done = subprocess.run(
        [*command, "-o", "json"], capture_output=True, text=True, timeout=120, check=True
    )
    for figures in json.loads(done.stdout)["projects"].values():
        assert figures["fair_share_ratio"] == figures["gpu_hours"] / figures["fair_share_gpu_hours"]
