"""The audit benchmark still runs (at a tiny size): the audit before it streamed and now, each in
a process of its own, from a log built and saved, then from that export; their figures are
reported, never asserted, beyond that both audits agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import audit as bench_audit


def test_an_exported_log_audits_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "log.jsonl"
    runs = []
    for args in (["--save", str(saved)], ["--log", str(saved)]):
        with pytest.raises(SystemExit) as done:  # cyclopts exits with the command's status
            bench_audit.app(["--hours", "0.25", "--nodes", "2", "-o", "json", *args])
        assert done.value.code == 0
        runs.append(json.loads(capsys.readouterr().out)["results"])
    built, read = runs
    assert built["gpus"] == 16 and built["jobs"] == bench_audit.jobs_for(0.25, 2)
    assert read["build_s"] == 0.0  # read from the export, not built again
    for figure in ("jobs", "gpus", "events", "decisions"):
        assert read[figure] == built[figure], figure
    for results in runs:
        baseline, streaming = results["baseline"], results["streaming"]
        for run in (baseline, streaming):  # the simulator's log audits clean, both ways
            assert run["matched"] == run["checked"] == results["decisions"] > 0
            assert run["decisions_per_s"] > 0 and run["peak_mib"] >= run["start_mib"] > 0
        assert streaming["plans"] == baseline["plans"] > 0
        assert results["speed_ratio"] > 0 and results["memory_ratio"] > 0
