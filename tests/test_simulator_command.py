"""`fairlane simulate` end to end: JSON keys, tables and plots, and clear errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairlane.cli import app
from simulation.trace.metrics import Series
from simulation.trace.plots import Curves, binned, write_plots

JSON_KEYS = {
    "jobs_completed",
    "avg_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p99_queue_s",
    "makespan_s",
    "utilization",
    "preemptions",
    "gpu_hours_lost",
    "projects",
    "fairness",
}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,submit_s,duration_s,gpus,project\n"
        "a1,0,3600,8,a\n"
        "a2,0,3600,8,a\n"
        "b1,600,1800,8,b\n"
        "b2,700,60,16,b\n"
        "huge,800,60,64,b\n"
    )
    return path


def cli(*args: str) -> int:
    try:
        app(["simulate", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_json_has_the_figures(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--trace", str(trace), "--nodes", "2", "-o", "json", "--no-progress") == 0
    result = json.loads(capsys.readouterr().out)
    assert result.keys() >= JSON_KEYS
    assert result["jobs_completed"] == 4 and result["jobs_rejected"] == 1
    assert set(result["projects"]) == {"a", "b"}
    ratio = result["projects"]["a"]["fair_share_ratio"]
    assert ratio is not None and ratio > 0
    # quotas: shares of the offered load that fits (a: 57,600 GPU-s, b: 15,360) of 16 GPUs:
    # 12.63 and 3.37, rounded down to 12 and 3, and the GPU left over goes to a's .63
    assert (result["projects"]["a"]["quota"], result["projects"]["b"]["quota"]) == (13, 3)


def test_text_report_and_plots(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plots"
    args = ("--trace", str(trace), "--nodes", "2", "--policy", "fair_share", "--out", str(out))
    assert cli(*args, "--victim-order", "cost") == 0
    text = capsys.readouterr().out
    assert "avg / p50 / p99 JCT" in text and "fair GPU-h" in text
    for name in ("utilization.png", "queue.png", "jct_cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_of_an_empty_run(tmp_path: Path) -> None:
    paths = write_plots(Curves(Series(), [], 8, 0.0), tmp_path, "nothing")
    assert all(p.stat().st_size > 0 for p in paths)


def test_binned_means_keep_the_area() -> None:
    edges, mean = binned([0.0, 10.0, 30.0], [4, 2, 0], 40.0, bins=4)
    assert list(edges) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert list(mean) == [4.0, 2.0, 2.0, 0.0]


def test_cluster_and_quota_files(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "config: {scheduler: {fitting: worst}}\n"
        "pools: [{name: gpu, nodes: [{name: x, gpus: 8}, {name: y, gpus: 8}]}]\n"
        "projects: [{name: a, quota: 10}, {name: b, quota: 6}]\n"
    )
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("b: {quota: 3, limit: 16}\n")
    args = ("--trace", str(trace), "--cluster", str(cluster), "--quotas", str(quotas))
    assert cli(*args, "-o", "json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["gpus"] == 16 and result["quota_source"] == "--cluster and --quotas"
    assert (result["projects"]["a"]["quota"], result["projects"]["b"]["quota"]) == (10, 3)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--trace", "nope"), "unknown trace 'nope'"),
        (("--trace", "missing.csv"), "trace file 'missing.csv' does not exist"),
        (("--trace", "{trace}", "--from", "yesterday"), "--from: 'yesterday' is not a number"),
        (("--trace", "{trace}", "--round", "soon"), "--round: 'soon' is not a duration"),
        (("--trace", "{trace}", "--projects", "zz"), "--projects: 'zz' is not a project"),
        (("--trace", "{trace}", "--quotas", "none.yaml"), "--quotas none.yaml: cannot read it"),
        (("--trace", "{trace}", "--nodes", "0"), "--nodes must be 1 or more, got 0"),
        (("--trace", "{trace}", "--las-thresholds", "x"), "--las-thresholds: 'x' is not"),
        (("--trace", "{trace}", "--first", "0"), "--first must be 1 or more"),
    ],
)
def test_bad_input_is_a_clear_error(
    trace: Path, args: tuple[str, ...], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(*(a.replace("{trace}", str(trace)) for a in args), "-o", "json")
    captured = capsys.readouterr()
    assert code == 2
    assert fragment in " ".join(captured.err.split())
    assert "Traceback" not in captured.err and captured.out == ""


def test_bad_cluster_file(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("pools: [{name: gpu, nodes: [{name: x, gpu: 8}]}]\n")
    assert cli("--trace", str(trace), "--cluster", str(cluster)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cluster.yaml" in err and "'gpus'" in err
