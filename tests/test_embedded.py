"""`fairlane up` / `down` and the job commands, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.runtime.servers import free_port

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
        assert set(info["pids"]) == {"supervisor"}  # the servers are supervised too
        status = json.loads((data / "supervisor-status.json").read_text())["programs"]
        assert set(status) == {
            "nats-server",
            "postgres",
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


def test_foreground_up_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    """A person runs `fairlane up` in a terminal, reads what it prints, and presses Ctrl-C:
    every log path it printed exists, and everything stops without a warning or a traceback."""
    data = tmp_path / "fl"
    ports = ["--nats-port", str(free_port()), "--api-port", str(free_port())]
    cmd = [sys.executable, "-m", "fairlane.cli", "up", "--gpus", "2", "--data-dir", str(data)]
    env = {**os.environ, "COLUMNS": "400"}  # one table row a line, paths unbroken
    proc = subprocess.Popen(
        [*cmd, *ports], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    printed: list[str] = []
    deadline = time.monotonic() + 180
    while "Ctrl-C stops everything." not in "".join(printed):
        line = proc.stdout.readline()
        assert line or proc.poll() is None, f"up exited early: {''.join(printed)}"
        printed.append(line)
        assert time.monotonic() < deadline, "up did not say it is up"
    info = json.loads((data / "cluster.json").read_text())
    status = json.loads((data / "supervisor-status.json").read_text())["programs"]
    logs = re.findall(r"log (/\S+\.log)", "".join(printed))
    assert len(logs) == len(info["pids"]) + len(status)  # one for each program it started
    assert all(Path(log).is_file() for log in logs), logs

    proc.send_signal(signal.SIGINT)
    out, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "stopped: " in out and "nats-server" in out
    assert "Traceback" not in stderr and "Warning" not in stderr and "warning" not in stderr
    assert not (data / "cluster.json").exists()
    for pid in [*info["pids"].values(), *(p["pid"] for p in status.values())]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_demo_plays_the_exercise_through_the_api() -> None:
    """`make demo`: its own cluster, the three steps each holding, the training job's
    timeline with the reclaim, and nothing left running."""
    cmd = [sys.executable, "-m", "fairlane.cli", "demo"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("holds: ") == 3 and "did not happen" not in done.stdout
    assert done.stdout.count("PASS") == 4  # the example scenarios on the core engine
    assert "large-training-job" in done.stdout and "reclaim" in done.stdout
    assert "Traceback" not in done.stderr
