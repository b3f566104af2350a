"""`fairlane up` / `down` and the job commands, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

from cluster.servers import free_ports

pytestmark = pytest.mark.slow


def port_flags() -> list[str]:
    """`--nats-port` and `--api-port` for a cluster of a test's own (another cluster on this
    machine may take the defaults meanwhile): two different free ports."""
    nats_port, api_port = free_ports(2)
    return ["--nats-port", str(nats_port), "--api-port", str(api_port)]


def fairlane(*args: str, data_dir: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    options, command = (
        (args, ()) if "--" not in args else (args[: args.index("--")], args[args.index("--") :])
    )
    cmd = [sys.executable, "-m", "fairlane.cli", *options, "--data-dir", str(data_dir), *command]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    # a failure says what the command said, not only its exit status
    assert not check or done.returncode == 0, (
        f"{cmd}: {done.returncode}\n{done.stdout}{done.stderr}"
    )
    return done


def test_up_submit_pause_delete_down(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    # its job runs this run's interpreter, which may sit where no job's own user may run it
    # (root's home): workloads as users of their own are tests/test_tenant.py's
    up = fairlane("up", "--detach", "--gpus", "2", "--insecure-same-user", data_dir=data)
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
        # a second cluster told to take this one's API port says so, and leaves nothing running
        api_port = info["api_url"].rsplit(":", 1)[1]
        (nats_port,) = free_ports(1)
        other = tmp_path / "other"
        ports = ("--nats-port", str(nats_port), "--api-port", api_port)
        taken = fairlane("up", "--detach", "--gpus", "1", *ports, data_dir=other, check=False)
        assert taken.returncode == 1, taken.stdout + taken.stderr
        assert f"port {api_port} answers for another Fairlane cluster's API" in taken.stderr
        assert not (other / "cluster.json").exists()
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
    ports = port_flags()
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


class JobJson(TypedDict):
    """The fields of `fairlane describe -o json`'s job that these tests read."""

    state: str
    attempt: int
    preemptions: int
    running_s: float


class EventJson(TypedDict):
    """An event of the job's timeline, as `describe --events -o json` shows it."""

    type: str
    reason: str | None
    event: dict[str, Any]  # the event itself, as stored


class Described(TypedDict):
    job: JobJson
    events: list[EventJson]


def _job(name: str, data: Path) -> Described:
    """The job and its whole timeline. `describe` shows the newest 50 events by default, and
    a job that checkpoints every 0.2 s pushed its first attempt's end past them on a busy
    machine (the test failed once in CI that way)."""
    described = fairlane(
        "describe", name, "--events", "--limit", "2000", "-o", "json", data_dir=data
    )
    job: Described = json.loads(described.stdout)
    return job


def _wait_for(check: Callable[[], bool], what: str, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.5)


def test_down_and_up_keep_the_running_jobs(tmp_path: Path) -> None:
    """`fairlane down` with two jobs running stops them as a preemption does (reason
    `shutdown`, checkpoint saved); `fairlane up` queues them again and they resume from their
    checkpoints: neither is failed, and "Ran" counts only the time they ran."""
    data = tmp_path / "fl"
    ports = port_flags()
    fairlane("up", "--detach", "--gpus", "2", "--insecure-same-user", *ports, data_dir=data)
    try:
        fairlane("project", "set", "team", "--quota", "2", data_dir=data)
        train = [
            sys.executable,
            str(Path(__file__).resolve().parent.parent / "examples" / "train.py"),
        ]
        train += ["--steps", "1000000", "--step-seconds", "0.01", "--checkpoint-every", "20"]
        for name in ("train-a", "train-b"):
            fairlane(
                "submit", name, "--project", "team", "--gpus", "1", "--", *train, data_dir=data
            )

        def saved(name: str) -> bool:
            job = _job(name, data)
            events = job["events"]
            return job["job"]["state"] == "running" and any(
                e["type"] == "JobCheckpointed" for e in events
            )

        _wait_for(lambda: saved("train-a") and saved("train-b"), "both running and saved")
    finally:
        fairlane("down", data_dir=data)
    down_at = time.time()
    time.sleep(5.0)  # the cluster is down a while: not counted as running time
    fairlane("up", "--detach", "--gpus", "2", "--insecure-same-user", *ports, data_dir=data)
    try:

        def resumed(name: str) -> bool:
            job = _job(name, data)["job"]
            return job["state"] == "running" and job["attempt"] == 2

        _wait_for(lambda: resumed("train-a") and resumed("train-b"), "both running again")
        for name in ("train-a", "train-b"):
            described = _job(name, data)
            events = described["events"]
            types = [e["type"] for e in events]
            assert "JobFailed" not in types, types
            stop = next(e for e in events if e["type"] == "JobPreempted")
            assert (stop["reason"], stop["event"]["checkpointed"]) == ("shutdown", True)
            assert described["job"]["preemptions"] == 0
            ran = described["job"]["running_s"]
            assert ran < time.time() - down_at, "the time the cluster was down counted as ran"
            logs = fairlane("logs", name, "--attempt", "2", data_dir=data).stdout
            first = fairlane("logs", name, "--attempt", "1", data_dir=data).stdout
            step = re.search(r"stopping at step (\d+)", first)
            assert step is not None, first
            assert f"resumed from step {step.group(1)}" in logs, logs
    finally:
        fairlane("down", data_dir=data)
