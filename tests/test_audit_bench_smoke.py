"""The audit benchmark still runs (at a tiny size); its figures are reported, never asserted."""

from __future__ import annotations

import json

import pytest

from bench import audit as bench_audit


def test_audit_bench_measures_a_tiny_log() -> None:
    figures = bench_audit.measure(hours=0.5, nodes=4)
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
