"""The audit benchmark still runs (at a tiny size); its figures are reported, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import audit as bench_audit


def test_audit_bench_measures_a_tiny_log() -> None:
    log, built_s = bench_audit.build(hours=0.5, nodes=4, load=bench_audit.LOAD)
    figures = bench_audit.measure(log, built_s)
    assert figures.events > figures.decisions > 0
    assert figures.matched == figures.decisions  # the simulator's log audits clean
    assert 0 < figures.plans <= figures.decisions
    assert figures.decisions_per_s > 0 and figures.day_s > 0


def test_audit_bench_command_line_writes_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:  # cyclopts exits with the command's status
        bench_audit.app(["--hours", "0.25", "--nodes", "2", "-o", "json"])
    assert done.value.code == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results["gpus"] == 16 and results["jobs"] == bench_audit.jobs_for(0.25, 2)


def test_an_exported_log_audits_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "log.jsonl"
    runs = []
    for args in (["--save", str(saved)], ["--log", str(saved)]):
        with pytest.raises(SystemExit) as done:
            bench_audit.app(["--hours", "0.25", "--nodes", "2", "-o", "json", *args])
        assert done.value.code == 0
        runs.append(json.loads(capsys.readouterr().out)["results"])
    built, read = runs
    assert read["build_s"] == 0.0  # read from the export, not built again
    for figure in ("jobs", "gpus", "events", "decisions", "plans", "matched"):
        assert read[figure] == built[figure], figure
