"""The embedded cluster's supervisor, as a user meets it: a crashed service comes back (and
takes its durable consumer back), a service that cannot start is reported by `up`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from cluster.supervisor import Plan, Program, Supervisor, read_status, stop_within
from services.runtime.auth import ADMIN, credentials_file, load_credentials
from services.runtime.connection import connect
from services.runtime.eventlog import STREAM
from tests.test_embedded import fairlane, port_flags

pytestmark = pytest.mark.slow
#: skip starting PostgreSQL: nothing here reads it
NO_POSTGRES = ("--postgres", "postgresql://unused")


def programs(data: Path) -> dict[str, dict[str, object]]:
    status: dict[str, dict[str, object]] = json.loads(
        (data / "supervisor-status.json").read_text()
    )["programs"]
    return status


async def consumers(data: Path, url: str) -> list[str]:
    creds = load_credentials(credentials_file(data, ADMIN))
    nc = await connect(url, "test", credentials=creds)
    try:
        return sorted(c.name for c in await nc.jetstream().consumers_info(STREAM))
    finally:
        await nc.close()


def test_a_killed_service_is_restarted_and_reuses_its_consumer(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    # the API, which commands go through; ports of its own, as another test may start a cluster
    fairlane("up", "--detach", "--gpus", "2", *port_flags(), data_dir=data)
    try:
        url = json.loads((data / "cluster.json").read_text())["nats_url"]
        before = asyncio.run(consumers(data, url))
        assert any(name.startswith("scheduler-") for name in before), before
        victim = programs(data)["scheduler"]["pid"]
        assert isinstance(victim, int)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            scheduler = programs(data)["scheduler"]
            if scheduler["state"] == "running" and scheduler["pid"] != victim:
                break
            assert time.monotonic() < deadline, scheduler
            time.sleep(0.2)
        assert scheduler["restarts"] == 1 and scheduler["last_exit"] == -signal.SIGKILL
        status = fairlane("status", data_dir=data, check=False)
        assert "restarted 1x" in status.stdout
        assert status.returncode == 1  # it exited within the last minute
        log = (data / "logs" / "supervisor.log").read_text()
        assert '"program": "scheduler"' in log and "exited, restarting" in log
        # the new process works: a job is placed after the restart
        assert fairlane("project", "set", "t", "--quota", "2", data_dir=data).returncode == 0
        fairlane("submit", "j1", "--project", "t", "--gpus", "2", data_dir=data)
        time.sleep(3)  # its consumer is made once it has caught up
        assert asyncio.run(consumers(data, url)) == before  # the same names: none left behind
    finally:
        fairlane("down", data_dir=data)


def test_up_reports_a_service_that_failed_to_start(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    up = fairlane("up", "--detach", "--gpus", "-1", *NO_POSTGRES, data_dir=data, check=False)
    try:
        assert up.returncode == 1
        assert "not everything is up" in up.stdout
        assert "executor failed to start" in up.stderr
        assert "--gpus must be 0 or more" in up.stderr  # the tail of its log says why
        assert programs(data)["executor"]["last_exit"] == 2
        assert programs(data)["admission"]["state"] == "running"
        status = fairlane("status", data_dir=data, check=False)
        assert status.returncode == 1 and "last exit 2" in status.stdout
    finally:
        down = fairlane("down", data_dir=data)
    assert "supervisor" in down.stdout


def test_sighup_starts_what_the_plan_gained_and_stops_what_it_lost(tmp_path: Path) -> None:
    """`fairlane node start` and `node stop` change the plan and send SIGHUP: the programs
    the plan kept run on untouched."""
    sleep = ["-c", "import time; time.sleep(600)"]
    status_file = tmp_path / "status.json"

    def plan(*names: str) -> bytes:
        programs = [Program(name, sleep) for name in names]
        return msgspec.json.encode(Plan(programs, str(tmp_path), str(status_file)))

    def running(*names: str) -> dict[str, int]:
        deadline = time.monotonic() + 20
        while True:
            status = read_status(status_file)
            now = status.programs if status is not None else {}
            pids = {n: p.pid for n, p in now.items() if p.state == "running" and p.pid}
            if set(now) == set(names) and set(pids) == set(names):
                return pids
            assert time.monotonic() < deadline, now
            time.sleep(0.1)

    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(plan("a", "b"))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "cluster.supervisor", "--plan", str(plan_file)],
        stderr=subprocess.DEVNULL,
    )
    try:
        before = running("a", "b")
        plan_file.write_bytes(plan("b", "c"))
        supervisor.send_signal(signal.SIGHUP)
        after = running("b", "c")
        assert after["b"] == before["b"]
        with pytest.raises(ProcessLookupError):
            os.kill(before["a"], 0)
        plan_file.write_bytes(b"not a plan")  # a broken plan is refused: the old one runs on
        supervisor.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert running("b", "c") == after and supervisor.poll() is None
    finally:
        supervisor.terminate()
        supervisor.wait(30)
    for pid in after.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_programs_marked_stop_first_are_stopped_before_the_others(tmp_path: Path) -> None:
    """The node executor reports its workloads stopped through the log as it exits, so the
    supervisor stops it first and the rest (which it needs) only once it has exited."""
    said = tmp_path / "said"
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    time.sleep(float(sys.argv[2]))\n"
        "    open(sys.argv[3], 'a').write(sys.argv[1] + '\\n')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(60)\n"
    )

    def program(name: str, takes: float, first: bool = False) -> Program:
        args = ["-c", script, name, str(takes), str(said)]
        return Program(name, args, stop_first=first, stop_grace_s=5.0)

    # the one stopped first takes longer to exit than the other: stopped together, the other
    # would say so first
    plan = Plan(
        programs=[program("service", 0.0), program("executor", 1.0, first=True)],
        log_dir=str(tmp_path),
        status_file=str(tmp_path / "status.json"),
    )
    assert stop_within(plan) == 10.0

    async def run() -> None:
        supervisor = Supervisor(plan)
        running = asyncio.create_task(supervisor.run())
        await asyncio.sleep(2.0)  # both started, their handlers set
        assert len(supervisor.processes) == 2
        supervisor.stopping.set()
        await asyncio.wait_for(running, 20)

    asyncio.run(run())
    assert said.read_text().splitlines() == ["executor", "service"]


def test_nats_server_and_postgres_killed_9_come_back_by_themselves(tmp_path: Path) -> None:
    """Both servers run under the supervisor: each killed -9 is started again on its data
    folder (the stream, the read models) and its port, and a job submitted after runs."""
    data = tmp_path / "fl"
    ports = port_flags()
    try:  # (a failed `up` leaves the cluster to `down` too)
        fairlane("up", "--detach", "--gpus", "2", *ports, data_dir=data)
        deadline = time.monotonic() + 30
        while (project := fairlane("project", "set", "t", data_dir=data, check=False)).returncode:
            assert time.monotonic() < deadline, project.stderr  # the API is slow to listen
            time.sleep(0.5)
        for name in ("nats-server", "postgres"):
            victim = programs(data)[name]["pid"]
            if name == "postgres":  # the server itself, not its keeper
                victim = int((data / "postgres" / "postmaster.pid").read_text().split()[0])
            assert isinstance(victim, int)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while (program := programs(data)[name])["restarts"] != 1 or program["state"] != (
                "running"
            ):
                assert time.monotonic() < deadline, program
                time.sleep(0.2)
        submit = ["submit", "after", "--project", "t", "--gpus", "1", "--command", "true"]
        # the keeper runs again at once; the server takes a few seconds to recover its data
        while (submitted := fairlane(*submit, data_dir=data, check=False)).returncode:
            assert "unavailable just now" in submitted.stderr, submitted.stderr
            assert time.monotonic() < deadline, submitted.stderr
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while True:  # read through the API, from PostgreSQL, fed from the stream
            job = fairlane("describe", "after", "-o", "json", data_dir=data, check=False)
            if job.returncode == 0 and json.loads(job.stdout)["state"] == "completed":
                break
            assert time.monotonic() < deadline, job.stdout + job.stderr
            time.sleep(0.5)
        assert {p["state"] for p in programs(data).values()} == {"running"}
    finally:
        down = fairlane("down", data_dir=data)
    assert "nats-server" in down.stdout and "postgres" in down.stdout
