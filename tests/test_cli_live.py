"""The command line as a person uses it, against one embedded cluster for the module
(`fairlane up`: nats-server, PostgreSQL, the services, a node executor running real
workloads, the projector and the HTTP API): the Run:AI exercise entirely through the CLI,
job output through `fairlane logs`, the errors and exit statuses, and `fairlane top` in a
real terminal (tmux)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from ruamel.yaml import YAML

from cluster.servers import free_port
from events import ClusterConfigured, ClusterSettings, NodeRegistered
from events.commands import ConfigureCluster
from services.runtime.auth import ADMIN, credentials_file, load_credentials
from services.runtime.client import send
from services.runtime.connection import connect
from services.runtime.eventlog import JetStreamLog
from tests.test_embedded import port_flags

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def fairlane(
    data: Path, *args: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fairlane.cli", *args]
    env = {**os.environ, "FAIRLANE_CONFIG": str(data / "no-config.yaml"), "COLUMNS": "160"}
    env.pop("FAIRLANE_API", None)
    env.pop("FAIRLANE_TOKEN", None)
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=data.parent, env=env, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"fairlane {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def data() -> Iterator[Path]:
    """The cluster runs from `<folder>/.fairlane`, the default data folder of a command run
    in `<folder>`: the commands below name no --data-dir, --api or --token."""
    # outside pytest's folder, which other pytest runs make private again: PostgreSQL runs
    # as another user (see the postgres_server fixture)
    with tempfile.TemporaryDirectory(prefix="fairlane-cli-") as folder:
        data = Path(folder) / ".fairlane"
        data.mkdir()
        # ports of its own: another cluster on this machine may take the defaults meanwhile
        ports = port_flags()
        # its jobs run this run's interpreter, which may sit where no job's own user may run
        # it (root's home): workloads as users of their own are tests/test_tenant.py's
        same_user = ["--insecure-same-user"]
        fairlane(data, "up", "--detach", "--gpus", "8", *ports, *same_user, timeout=180)
        try:
            yield data
        finally:
            fairlane(data, "down", check=False, timeout=120)


def read(data: Path, *args: str) -> Any:
    return json.loads(fairlane(data, *args, "-o", "json").stdout)


def until(
    look: Callable[[], Any], holds: Callable[[Any], bool], what: str, within: float = 90.0
) -> Any:
    deadline = time.monotonic() + within
    while True:
        seen = look()
        if holds(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: last seen {seen!r}")
        time.sleep(0.5)


def usage(projects: list[dict[str, Any]]) -> dict[str, tuple[int, int, int, bool]]:
    """project -> (in use, quota, fair share, over quota) in the default pool."""
    return {
        p["name"]: (pool["usage"], pool["quota"], pool["fair_share"], pool["over_quota"])
        for p in projects
        for pool in p["pools"]
    }


def test_runai_exercise_through_the_cli(data: Path) -> None:
    until(lambda: read(data, "nodes"), lambda n: len(n) == 1, "the node registered")
    for project in ("project-a", "project-b"):
        said = fairlane(data, "project", "set", project, "--quota", "4").stdout
        assert f"project {project} configured in default: quota 4" in said

    def training() -> dict[str, Any]:
        described: dict[str, Any] = read(data, "describe", "large-training-job", "--events")
        return described

    def kinds(described: dict[str, Any]) -> list[str]:
        return [e["type"] for e in described["events"] if e["applied"]]

    # 1. the training job takes all 8 GPUs, 4 of them over quota
    submitted = fairlane(
        data, "submit", "large-training-job", "--project", "project-a", "--class", "train",
        "--gpus", "8",
    )  # fmt: skip
    assert "job large-training-job admitted (priority 50, pool default)" in submitted.stdout
    first = until(training, lambda d: d["job"]["state"] == "running", "training runs")
    assert first["job"]["gpus_held"] == 8 and first["job"]["attempt"] == 1
    assert kinds(first)[:4] == ["JobSubmitted", "JobAdmitted", "JobScheduled", "JobStarted"]
    projects = until(
        lambda: read(data, "projects"), lambda p: usage(p)["project-a"][0] == 8, "8 in use"
    )
    assert usage(projects) == {"project-a": (8, 4, 8, True), "project-b": (0, 4, 0, False)}

    # 2. the workspace reclaims project-b's quota: the training job is preempted and waits
    fairlane(
        data, "submit", "jupyter-workspace", "--project", "project-b", "--class", "interactive",
        "--gpus", "4",
    )  # fmt: skip
    waiting = until(training, lambda d: d["job"]["state"] == "pending", "training waits")
    assert waiting["job"]["preemptions"] == 1
    reason = waiting["job"]["pending_reason"]
    assert reason["code"] == "fair_share_reached" and "jupyter-workspace" in reason["message"]
    (request,) = [e for e in waiting["events"] if e["type"] == "JobPreemptionRequested"]
    assert request["reason"] == "reclaim" and request["for_job"] == "jupyter-workspace"
    assert request["event"]["facts"]["fair_share"] == {"project-a": 4, "project-b": 4}
    assert "JobPreempted" in kinds(waiting)
    projects = until(lambda: read(data, "projects"), lambda p: usage(p)["project-b"][0] == 4, "4/4")
    assert usage(projects) == {"project-a": (0, 4, 4, False), "project-b": (4, 4, 4, False)}
    said = fairlane(data, "describe", "large-training-job", "--events").stdout
    assert "Why pending" in said and "reason reclaim, to make room for jupyter-workspace" in said

    # 3. the workspace is deleted: the training job resumes on all 8 GPUs
    deleted = fairlane(data, "delete", "jupyter-workspace").stdout
    assert "job jupyter-workspace deleted" in deleted
    back = until(
        training,
        lambda d: d["job"]["state"] == "running" and d["job"]["attempt"] == 2,
        "training back",
    )
    assert back["job"]["gpus_held"] == 8 and back["job"]["pending_reason"] is None
    after = kinds(back)[kinds(back).index("JobPreemptionRequested") + 1 :]
    after = [k for k in after if k not in ("JobCheckpointed", "JobNominated")]
    assert after[:3] == ["JobPreempted", "JobScheduled", "JobStarted"]
    projects = until(
        lambda: read(data, "projects"), lambda p: usage(p)["project-a"][0] == 8, "8 again"
    )
    assert usage(projects) == {"project-a": (8, 4, 8, True), "project-b": (0, 4, 0, False)}

    # the same answers as YAML
    yaml = YAML(typ="safe").load(fairlane(data, "projects", "-o", "yaml").stdout)
    assert usage(yaml) == usage(projects)

    # each attempt's output, shipped from the node over NATS: the second resumed where the
    # first stopped
    first_out = fairlane(data, "logs", "large-training-job", "--attempt", "1").stdout
    second_out = fairlane(data, "logs", "large-training-job").stdout
    assert "training: attempt 1, from step 0" in first_out
    stopped_at = first_out.split("stopping at step ")[1].split(":")[0]
    assert f"training: attempt 2, from step {stopped_at}" in second_out


def test_workload_arguments_after_double_dash_and_logs_follow(data: Path) -> None:
    fairlane(data, "project", "set", "tools", "--quota", "0")
    script = 'echo first --not-an-option "$GREETING"; sleep 2; echo second -c'
    fairlane(
        data, "submit", "echo-job", "--project", "tools", "--gpus", "0", "--env", "GREETING=hi",
        "--", "sh", "-c", script,
    )  # fmt: skip
    until(
        lambda: read(data, "describe", "echo-job"),
        lambda j: j["attempt"] >= 1,
        "echo-job started",
    )
    # following ends by itself once the attempt is over and its output complete
    followed = fairlane(data, "logs", "echo-job", "--follow", timeout=60)
    assert followed.stdout == "first --not-an-option hi\nsecond -c\n"
    done = until(
        lambda: read(data, "describe", "echo-job"), lambda j: j["state"] == "completed", "done"
    )
    assert done["attempt"] == 1


def test_a_job_grace_period_of_its_own(data: Path) -> None:
    ignores_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(600)"
    )
    fairlane(
        data, "submit", "stubborn", "--project", "tools", "--gpus", "0", "--grace", "1",
        "--", "python3", "-c", ignores_sigterm,
    )  # fmt: skip
    until(lambda: fairlane(data, "logs", "stubborn", check=False).stdout, lambda o: o == "up\n",
          "stubborn runs")  # fmt: skip
    # a job that has said nothing yet: nothing on stdout, and stderr says why it is empty
    fairlane(data, "submit", "quiet", "--project", "tools", "--gpus", "0", "--", "sleep", "600")
    until(lambda: read(data, "describe", "quiet"), lambda j: j["attempt"] >= 1, "quiet started")
    quiet = fairlane(data, "logs", "quiet")
    assert quiet.stdout == "" and "attempt 1 of quiet has written no output yet" in quiet.stderr
    fairlane(data, "delete", "quiet")
    fairlane(data, "delete", "stubborn")
    events = until(
        lambda: read(data, "events", "--job", "stubborn"),
        lambda e: "JobPreempted" in [x["type"] for x in e],
        "stubborn stopped",
    )
    asked = next(e for e in events if e["type"] == "JobPreemptionRequested")
    stopped = next(e for e in events if e["type"] == "JobPreempted")
    assert stopped["event"]["killed"] is True
    # SIGKILL after its own grace of 1 s, not the cluster's 30 s
    assert stopped["time"] - asked["time"] < 20


def test_events_follow_prints_them_as_they_happen(data: Path) -> None:
    cmd = [sys.executable, "-m", "fairlane.cli", "events", "--follow", "--job", "live-1", "-o",
           "json"]  # fmt: skip
    env = {**os.environ, "FAIRLANE_CONFIG": str(data / "no-config.yaml")}
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=data.parent, env=env)
    deadline = threading.Timer(90, follower.kill)  # a stream that never delivers fails the test
    deadline.start()
    try:
        time.sleep(3)  # (it starts at the next event: let it connect first)
        fairlane(data, "submit", "live-1", "--project", "tools", "--gpus", "0", "--", "true")
        assert follower.stdout is not None
        seen: list[str] = []
        while "JobCompleted" not in seen:
            line = follower.stdout.readline()
            assert line, f"the stream ended after {seen}"
            seen.append(json.loads(line)["type"])
        assert seen[:2] == ["JobSubmitted", "JobAdmitted"] and "JobStarted" in seen
    finally:
        deadline.cancel()
        follower.terminate()
        follower.wait(timeout=10)


def test_errors_a_person_understands(data: Path) -> None:
    missing = fairlane(data, "describe", "large-trainin-job", check=False)
    assert missing.returncode == 1
    assert "no job named 'large-trainin-job' (did you mean large-training-job?)" in missing.stderr
    assert "Traceback" not in missing.stderr
    gone = fairlane(data, "pause", "jupyter-workspac", check=False)
    assert gone.returncode == 1 and "did you mean jupyter-workspace" in gone.stderr
    refused = fairlane(data, "submit", "x", "--project", "nobody", check=False)
    assert refused.returncode == 1 and "unknown project 'nobody'" in refused.stderr
    bad = fairlane(data, "list", "--limit", "0", check=False)
    assert bad.returncode == 2 and "--limit must be between 1 and 10000, got 0" in bad.stderr
    bad_env = fairlane(data, "submit", "y", "--project", "tools", "--env", "NOEQUALS", check=False)
    assert bad_env.returncode == 2 and "KEY=VALUE, got 'NOEQUALS'" in bad_env.stderr
    # the embedded cluster's node runs processes: an image would be ignored, so it is refused
    image = fairlane(data, "submit", "img", "--project", "tools", "--image", "alpine:3",
                     "--", "true", check=False)  # fmt: skip
    assert (
        image.returncode == 1
        and "--image alpine:3: this cluster's nodes run workloads as processes" in image.stderr
    )
    fraction = fairlane(data, "submit", "half", "--project", "tools", "--gpus", "0.5",
                        check=False)  # fmt: skip
    assert fraction.returncode == 2 and "fractional GPUs are not supported yet" in (fraction.stderr)
    bad_type = fairlane(data, "events", "--type", "Bogus", check=False)
    assert bad_type.returncode == 2 and "unknown event type 'Bogus'" in bad_type.stderr
    token = fairlane(data, "list", "--token", "not-a-token", check=False)
    assert token.returncode == 1 and "unknown API token" in token.stderr
    started = time.monotonic()
    away = fairlane(data, "list", "--api", "http://127.0.0.1:9", check=False)
    assert away.returncode == 1 and "cannot reach the Fairlane API at http://127.0.0.1:9" in (
        away.stderr
    )
    assert time.monotonic() - started < 30  # an error, not a hang
    elsewhere = fairlane(data, "list", "--data-dir", str(data.parent / "none"), check=False)
    assert elsewhere.returncode == 1 and "no cluster runs from" in elsewhere.stderr
    for result in (missing, gone, refused, bad, token, away, elsewhere):
        assert "Traceback" not in result.stderr


def test_events_and_cluster_info(data: Path) -> None:
    stops = read(data, "events", "--type", "JobPreempted")
    assert {e["type"] for e in stops} == {"JobPreempted"}
    reclaimed = [e["job_id"] for e in stops if e["event"]["reason"] == "reclaim"]
    assert reclaimed == ["large-training-job"]  # (the workspace was stopped: deleted)
    said = fairlane(data, "events", "--job", "large-training-job").stdout
    assert "JobPreemptionRequested" in said and "to make room for jupyter-workspace" in said
    info = read(data, "cluster-info")
    (pool,) = info["pools"]
    assert pool["gpus"] == 8 and pool["pool"] == "default"
    listed = read(data, "list", "--project", "project-a")
    assert [j["job_id"] for j in listed] == ["large-training-job"]
    table = fairlane(data, "list", "--all-projects").stdout
    assert "large-training-job" in table and "echo-job" in table


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("│").split("│")]


def tmux_available() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is needed for the terminal test (apt-get install tmux)")
        pytest.skip("tmux is not installed")
    return tmux


def test_top_in_a_real_terminal(data: Path) -> None:
    tmux = tmux_available()
    session = f"fairlane-top-{os.getpid()}"
    env = f"cd {data.parent} && env -u COLUMNS -u LINES FAIRLANE_CONFIG={data / 'no-config.yaml'}"
    # the pane stays a while after top exits, to be read
    command = f"{env} {sys.executable} -m fairlane.cli top --interval 0.5; echo top-exited-$?"
    command += "; sleep 60"
    socket = ["-L", session]  # a tmux server of its own

    def run(*args: str) -> str:
        return subprocess.run(
            [tmux, *socket, *args], capture_output=True, text=True, check=True, timeout=20
        ).stdout

    def screen() -> str:
        return run("capture-pane", "-p", "-t", session)

    run("new-session", "-d", "-s", session, "-x", "120", "-y", "45", command)
    try:
        shown = until(screen, lambda s: "Pools" in s and "large-training-job" in s, "top draws")
        assert "Fairlane top" in shown and "q quits" in shown
        pool = cells(next(line for line in shown.splitlines() if line.startswith("│ default")))
        assert pool[:6] == ["default", "1", "8", "8", "0", "0"]  # nodes, GPUs, in use, free
        project = cells(next(line for line in shown.splitlines() if "│ project-a" in line))
        assert project == ["project-a", "default", "4", "8", "8", "yes"]  # fair share, in use
        # a job that must wait shows up, with why, in place (the screen is redrawn, not
        # scrolled)
        fairlane(data, "submit", "waits-1", "--project", "project-b", "--gpus", "8")
        shown = until(screen, lambda s: "waits-1" in s and "pending" in s, "the queue")
        waiting = next(line for line in shown.splitlines() if "waits-1" in line)
        assert "project-b" in waiting and "0/8" in waiting
        assert shown.count("Fairlane top") == 1
        run("send-keys", "-t", session, "q")
        until(screen, lambda s: "top-exited-0" in s, "q quits")
    finally:
        subprocess.run([tmux, *socket, "kill-server"], capture_output=True, check=False)
        fairlane(data, "delete", "waits-1", check=False)


def test_a_new_users_verbs_on_a_live_cluster(data: Path) -> None:
    """What a runai or det user reaches for, against the real services: a job spec from a
    file, a default project, a new priority, the newest events, deleting several at once."""
    fairlane(data, "project", "set", "verbs", "--quota", "0")
    spec = data.parent / "job.yaml"
    spec.write_text("name: from-file\ngpus: 0\ncommand: [sleep, '600']\n")
    project = {"FAIRLANE_PROJECT": "verbs"}
    submitted = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "submit", "-f", str(spec)],
        capture_output=True, text=True, timeout=60, cwd=data.parent, check=False,
        env={**os.environ, **project, "FAIRLANE_CONFIG": str(data / "no-config.yaml")},
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert "job from-file admitted" in submitted.stdout
    fairlane(data, "submit", "second", "--project", "verbs", "--gpus", "0", "--", "sleep", "600")
    job = until(lambda: read(data, "describe", "from-file"), lambda j: j["attempt"] >= 1,
                "from-file started")  # fmt: skip
    assert job["project"] == "verbs"
    changed = fairlane(data, "update", "from-file", "--priority", str(job["priority"] + 7))
    assert f"job from-file changed: priority {job['priority'] + 7}" in changed.stdout
    again = until(lambda: read(data, "describe", "from-file"),
                  lambda j: j["priority"] == job["priority"] + 7, "the new priority")  # fmt: skip
    assert again["state"] in ("starting", "running")
    newest = read(data, "events", "--job", "from-file", "--limit", "1")
    assert [e["type"] for e in newest] == ["JobPriorityChanged"]
    same = fairlane(data, "update", "from-file", "--priority", str(job["priority"] + 7),
                    check=False)  # fmt: skip
    assert same.returncode == 1 and "has priority" in same.stderr and "--priority" in same.stderr
    deleted = fairlane(data, "delete", "from-file", "second").stdout
    assert "job from-file deleted" in deleted and "job second deleted" in deleted
    who = read(data, "whoami")
    assert who["name"] == "admin" and who["admin"] is True


def test_an_interactive_job_publishes_its_port_and_the_url_is_shown(data: Path) -> None:
    """`fairlane submit ws --class interactive --port HOST:CONTAINER`: the process is told the
    node's port and serves on it; `describe` and `list` show where it is reached. A second job
    asking the same host port waits (the node publishes it once); bad values are refused
    naming the flag."""
    fairlane(data, "project", "set", "ports-team", "--quota", "0")
    job = ("--project", "ports-team", "--class", "interactive", "--gpus", "0", "--pool", "default")
    for value, said in (
        ("70000:8888", "--port '70000:8888': ports are between 1 and 65535"),
        ("jupyter", "--port takes HOST:CONTAINER or PORT, got 'jupyter'"),
    ):
        bad = fairlane(data, "submit", "ws-bad", *job, "--port", value, check=False)
        assert bad.returncode == 2 and said in bad.stderr, bad.stderr
    twice = ("--port", "9000:8888", "--port", "9000:8889")
    bad = fairlane(data, "submit", "ws-bad", *job, *twice, check=False)
    assert bad.returncode == 2 and "host port 9000 is given twice" in bad.stderr
    assert fairlane(data, "describe", "ws-bad", check=False).returncode == 1  # nothing sent

    port = free_port()
    serve = f'exec {sys.executable} -m http.server --bind 127.0.0.1 "$FAIRLANE_PORT"'
    fairlane(data, "submit", "ws", *job, "--port", f"{port}:8888", "--", "sh", "-c", serve)
    url = f"http://127.0.0.1:{port}"
    running = until(
        lambda: read(data, "describe", "ws"),
        lambda j: j["state"] == "running" and j["urls"],
        "ws running with its URL",
    )
    assert (running["ports"], running["urls"]) == ([f"{port}:8888"], [url])
    assert re.search(rf"^URL +{url}$", fairlane(data, "describe", "ws").stdout, re.M)
    listed = fairlane(data, "list", "--project", "ports-team").stdout
    assert "URL" in listed.splitlines()[0] and url in listed

    def answers(_: object = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    until(answers, bool, f"{url} answers")

    fairlane(data, "submit", "ws-2", *job, "--port", f"{port}:9999", "--", "sleep", "600")
    time.sleep(2.0)  # cycles go by
    waiting = read(data, "describe", "ws-2")
    assert waiting["state"] == "pending" and waiting["urls"] == []
    reason = waiting["pending_reason"]
    assert reason["code"] == "ports_taken" and f"host ports ({port})" in reason["message"]
    for name in ("ws", "ws-2"):
        fairlane(data, "delete", name)


def test_cpu_only_work_goes_to_the_default_auxiliary_pool(data: Path) -> None:
    """Rule 10: a job with `--gpus 0` and no pool goes to the cluster's default auxiliary
    pool, a GPU job to the default compute pool (the cluster is configured through the
    ledger's command: neither the API nor the CLI sets the default pools)."""
    info = json.loads((data / "cluster.json").read_text())
    creds = load_credentials(credentials_file(data, ADMIN))

    async def configure(aux: str | None) -> None:
        nc = await connect(info["nats_url"], "test", credentials=creds)
        try:
            log = JetStreamLog(nc)
            if aux is not None:
                await log.publish(
                    NodeRegistered(
                        id=f"{aux}-0/registered/test", time=time.time(), actor="test",
                        node=f"{aux}-0", pool=aux, gpus=0,
                    )
                )  # fmt: skip
            last = await log.last_on("fl.cluster.cluster_configured")
            settings = (
                last.event.settings
                if last is not None and isinstance(last.event, ClusterConfigured)
                else ClusterSettings()
            )
            fields = msgspec.structs.asdict(settings)
            fields["default_aux_pool"] = aux
            reply = await send(nc, ConfigureCluster(actor="test", **fields))
            assert reply.ok, reply.error
        finally:
            await nc.close()

    fairlane(data, "project", "set", "aux-team", "--quota", "0")
    asyncio.run(configure("cpu"))
    try:
        cpu = read(data, "submit", "aux-1", "--project", "aux-team", "--gpus", "0")
        gpu = read(data, "submit", "aux-2", "--project", "aux-team", "--gpus", "1")
        assert cpu["event"]["pools"] == ["cpu"] and gpu["event"]["pools"] == ["default"]
        described = until(
            lambda: read(data, "describe", "aux-1"), lambda j: j["pool"] == "cpu", "aux-1 in cpu"
        )
        assert described["pools"] == ["cpu"]
    finally:
        asyncio.run(configure(None))
        for name in ("aux-1", "aux-2"):
            fairlane(data, "delete", name, check=False)
