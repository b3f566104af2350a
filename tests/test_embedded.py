"""`fairlane up` / `down` and the job commands, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def fairlane(*args: str, data_dir: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fairlane.cli", *args, "--data-dir", str(data_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)


def test_up_submit_pause_delete_down(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    up = fairlane("up", "--detach", "--gpus", "2", data_dir=data)
    assert "NATS (JetStream)" in up.stdout
    try:
        info = json.loads((data / "cluster.json").read_text())
        assert set(info["pids"]) == {"nats-server", "supervisor"}
        status = json.loads((data / "supervisor-status.json").read_text())["programs"]
        assert set(status) == {
            "admission",
            "ledger",
            "scheduler",
            "preemptor",
            "nodewatch",
            "executor",
            "projector",
            "api",
        }
        assert {p["state"] for p in status.values()} == {"running"}
        assert fairlane("project", "set", "team", "--quota", "2", data_dir=data).returncode == 0
        submitted = fairlane(
            "submit", "train-1", "--project", "team", "--gpus", "2", "-o", "json", data_dir=data
        )
        assert json.loads(submitted.stdout)["event"]["type"] == "JobAdmitted"
        refused = fairlane("submit", "x", "--project", "nobody", data_dir=data, check=False)
        assert refused.returncode == 1 and "unknown project 'nobody'" in refused.stderr
        time.sleep(1.0)
        assert fairlane("pause", "train-1", data_dir=data).returncode == 0
        assert fairlane("delete", "train-1", data_dir=data).returncode == 0
        missing = fairlane("delete", "ghost", data_dir=data, check=False)
        assert missing.returncode == 1 and "unknown job id 'ghost'" in missing.stderr
    finally:
        down = fairlane("down", data_dir=data)
    assert "nats-server" in down.stdout and "postgres" in down.stdout
    assert not (data / "cluster.json").exists()
    for pid in [*info["pids"].values(), *(p["pid"] for p in status.values())]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
