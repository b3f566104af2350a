"""Several nodes on one machine, as a newcomer runs them: `fairlane up`, `fairlane node start`,
a training job drained off its node and resumed on the other from its step, the same after
the node it moved to is stopped and declared lost, a node joining with a credentials file as
from another machine, and the bad input refused with nothing half-applied; then the same move
and a gang's rendezvous with two nodes that run their jobs as Docker containers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, TypeVar

import pytest

from cluster.nodes import (
    NodeError,
    credentials_for,
    executor_args,
    program_of,
    with_program,
    without_program,
)
from cluster.servers import free_port
from cluster.supervisor import Plan, Program
from fairlane.client import Api, resolve
from services.runtime.auth import (
    ADMIN,
    Credentials,
    credentials_file,
    executor_user,
    load_credentials,
)
from services.runtime.checkpoint_bucket import checkpoint_bucket
from services.runtime.eventlog import connect
from tests import test_embedded
from tests.compose_support import docker
from tests.docker_support import DOCKER_HOST, engine, example_image

TRAIN = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")
#: its jobs run this run's interpreter, which may sit where no job's own user may run it
#: (root's home): workloads as users of their own are tests/test_tenant.py's; the nodes added
#: to the cluster follow its choice
SAME_USER = ("--insecure-same-user",)
T = TypeVar("T")


def fairlane(*args: str, data_dir: Path, check: bool = True) -> CompletedProcess[str]:
    """The command as a person runs it; a failure shows what it said."""
    done = test_embedded.fairlane(*args, data_dir=data_dir, check=False)
    assert not check or done.returncode == 0, f"fairlane {' '.join(args)}: {done.stderr}"
    return done


def eventually(probe: Callable[[], T | None], what: str, within: float = 60.0) -> T:
    deadline = time.monotonic() + within
    while True:
        found = probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.3)


def job(api: Api, attempt: int) -> dict[str, Any] | None:
    """The job, once `attempt` of it runs."""
    found: dict[str, Any] = api.get("/v1/jobs/train-1")
    return found if found["state"] == "running" and found["attempt"] == attempt else None


def timeline(api: Api, **kinds: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get("/v1/jobs/train-1/timeline", limit=500, **kinds)["items"]
    return items


def checkpointed(api: Api, attempt: int) -> list[int]:
    """The steps `attempt` reported saving (examples/train.py, through fairlane.workload)."""
    return [
        e["event"]["step"]
        for e in timeline(api, type="JobCheckpointed")
        if e["event"]["attempt"] == attempt and e["event"].get("step")
    ]


def described(data: Path) -> tuple[list[list[str]], set[str]]:
    """What `fairlane describe --events` says: the nodes of each placement, and why the job
    was stopped."""
    out = fairlane("describe", "train-1", "--events", "-o", "json", data_dir=data).stdout
    events = json.loads(out)["events"]
    placed = [e["nodes"] for e in events if e["type"] == "JobScheduled"]
    return placed, {e["reason"] for e in events if e["type"] == "JobPreempted"}


def said(output: str, what: str) -> int | None:
    """The step examples/train.py printed after `what` ("stopping at step", ...)."""
    found = re.findall(rf"{what} (\d+)", output)
    return int(found[-1]) if found else None


@pytest.mark.nats
def test_a_job_moves_between_two_nodes_on_one_machine_drained_then_lost(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    ports = test_embedded.port_flags()
    try:
        fairlane(
            "up",
            "--detach",
            "--gpus",
            "1",
            "--heartbeat-timeout",
            "3",
            *ports,
            *SAME_USER,
            data_dir=data,
        )
        info = json.loads((data / "cluster.json").read_text())
        host = info["node"]
        started = fairlane("node", "start", "gpu-b", "--gpus", "1", data_dir=data)
        assert "node gpu-b registered: pool default, 1 GPU(s)" in started.stdout
        status = json.loads((data / "supervisor-status.json").read_text())["programs"]
        assert status["executor-gpu-b"]["state"] == "running"
        refuses_taken_names(data, host)
        api = Api(resolve(None, None, data))
        nodes = {n["node"]: (n["gpus"], n["lost"]) for n in api.get("/v1/nodes")}
        assert nodes == {host: (1, False), "gpu-b": (1, False)}  # each its own declared GPU

        fairlane("project", "set", "team", "--quota", "2", data_dir=data)
        train = [f"--command={arg}" for arg in ("python3", TRAIN, "--steps=100000")]
        fairlane(
            "submit", "train-1", "--project", "team", "--class", "train", *train, data_dir=data
        )
        first = eventually(lambda: job(api, 1), "attempt 1 runs")
        [a] = first["nodes"]
        [b] = {host, "gpu-b"} - {a}
        stopped = drained(api, data, a, b)
        lost(api, data, (a, b), stopped, program_of_node(b, host))
        joins_from_elsewhere(api, data, tmp_path / "remote", info["nats_url"], a)
    finally:
        fairlane("down", data_dir=data)


def refuses_taken_names(data: Path, host: str) -> None:
    """This machine's own node, or the one just started: refused, the plan as it was."""
    plan = (data / "supervisor-plan.json").read_bytes()
    for taken, program in ((host, "executor"), ("gpu-b", "executor-gpu-b")):
        again = fairlane("node", "start", taken, "--gpus", "1", data_dir=data, check=False)
        assert again.returncode == 1, again.stderr
        assert f"node name '{taken}' is taken" in again.stderr
        assert f"supervised as {program}" in again.stderr
    assert (data / "supervisor-plan.json").read_bytes() == plan


def drained(api: Api, data: Path, a: str, b: str) -> int:
    """Node a drained: the job stops with a checkpoint and resumes on b from its step."""
    eventually(lambda: checkpointed(api, 1) or None, "attempt 1 saved a checkpoint")
    fairlane("node", "drain", a, "--reason", "driver upgrade", data_dir=data)
    second = eventually(lambda: job(api, 2), "attempt 2 runs")
    assert second["nodes"] == [b]
    stopped = eventually(  # its output is shipped a moment after it is written
        lambda: said(api.get_text("/v1/jobs/train-1/logs", attempt=1), "stopping at step"),
        "attempt 1 says where it stopped",
    )
    assert stopped > 0
    resumed = eventually(
        lambda: said(api.get_text("/v1/jobs/train-1/logs", attempt=2), "resumed from step"),
        "attempt 2 says where it resumed",
    )
    assert resumed == stopped
    logs = fairlane("logs", "train-1", "--attempt", "2", data_dir=data).stdout
    assert f"attempt 2: resumed from step {stopped}" in logs
    assert described(data) == ([[a], [b]], {"drain"})
    return stopped


def lost(api: Api, data: Path, moves: tuple[str, str], stopped: int, program: str) -> None:
    """Node b's executor stopped: its heartbeats stop, the watcher declares it lost (3 s
    here) and the job resumes on a, back in service, from b's last stored save."""
    a, b = moves
    fairlane("node", "uncordon", a, data_dir=data)
    eventually(lambda: len(checkpointed(api, 2)) > 1 or None, "attempt 2 saved twice")
    time.sleep(1.5)  # the executor stores a save at its next checkpoint poll (every 1 s)
    stop = fairlane("node", "stop", b, data_dir=data)
    assert f"node {b} stopped" in stop.stdout
    assert program not in json.loads((data / "supervisor-status.json").read_text())["programs"]
    third = eventually(lambda: job(api, 3), "attempt 3 runs", within=30)
    assert third["nodes"] == [a]
    assert {n["node"]: n["lost"] for n in api.get("/v1/nodes")} == {a: False, b: True}
    from_step = eventually(
        lambda: said(api.get_text("/v1/jobs/train-1/logs", attempt=3), "resumed from step"),
        "attempt 3 says where it resumed",
    )
    assert from_step > stopped and from_step in checkpointed(api, 2)
    assert described(data) == ([[a], [b], [a]], {"drain"})
    assert "lost" in fairlane("nodes", data_dir=data).stdout


def joins_from_elsewhere(api: Api, data: Path, remote: Path, url: str, a: str) -> None:
    """A node joining as from another machine: its own credentials file (another node's is
    refused before anything starts), its own supervisor; its name is then taken."""
    mine = remote.parent / "gpu-c.json"
    fairlane("node", "credentials", "gpu-c", "-O", str(mine), data_dir=data)
    joining = ("--gpus", "1", "--nats", url, "--credentials", str(mine))
    wrong = fairlane("node", "start", "gpu-d", *joining, data_dir=remote, check=False)
    assert wrong.returncode == 2
    assert f"--credentials {mine} holds the NATS user 'executor-gpu-c'" in wrong.stderr
    assert "not node gpu-d's 'executor-gpu-d'" in wrong.stderr
    assert not (remote / "nodes" / "gpu-d").exists()
    api_url = ("--gpus", "1", "--nats", "http://127.0.0.1:8080", "--credentials", str(mine))
    malformed = fairlane("node", "start", "gpu-c", *api_url, data_dir=remote, check=False)
    assert malformed.returncode == 2  # the API's URL for the NATS server's: said at once
    said = "--nats http://127.0.0.1:8080: 'http://127.0.0.1:8080' is not a NATS server's address"
    assert said in malformed.stderr
    nowhere = f"nats://127.0.0.1:{free_port()}"  # a typo in the URL: said, not waited on
    lost = ("--gpus", "1", "--nats", nowhere, "--credentials", str(mine))
    unanswered = fairlane("node", "start", "gpu-c", *lost, data_dir=remote, check=False)
    assert unanswered.returncode == 1
    assert f"cannot reach NATS at {nowhere}: no server answered within" in unanswered.stderr
    fairlane("node", "start", "gpu-c", *joining, data_dir=remote)
    assert {n["node"] for n in api.get("/v1/nodes") if not n["lost"]} == {a, "gpu-c"}
    keeps_its_files_private(remote, remote / "nodes" / "gpu-c")
    clash = fairlane("node", "start", "gpu-c", "--gpus", "1", data_dir=data, check=False)
    assert clash.returncode == 1 and "a node of that name is running" in clash.stderr
    fairlane("node", "stop", "gpu-c", data_dir=remote)
    gone = fairlane("node", "stop", "gpu-c", data_dir=remote, check=False)
    assert gone.returncode == 1 and "no node named 'gpu-c' runs from" in gone.stderr


def keeps_its_files_private(data: Path, folder: Path) -> None:
    """As `fairlane up` keeps its data folder: jobs (each a uid of its own where we are root)
    pass through to their folders and read nothing else; the log names every job of the node."""
    passed = 0o711 if os.geteuid() == 0 else 0o700
    for crossed in (data, data / "nodes", folder):
        assert crossed.stat().st_mode & 0o777 == passed, crossed
    assert (folder / "logs").stat().st_mode & 0o777 == 0o700
    files = [f for f in (*folder.iterdir(), *(folder / "logs").iterdir()) if f.is_file()]
    assert files and all(f.stat().st_mode & 0o077 == 0 for f in files), files


def program_of_node(node: str, host: str) -> str:
    return "executor" if node == host else f"executor-{node}"


@pytest.mark.docker
@pytest.mark.nats
def test_docker_nodes_move_a_job_by_the_object_store_and_meet_as_a_gang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes on this machine that run their jobs as containers of the job's image, each
    with its own executor and data folder: a training job drained off one resumes on the other
    from its step, its checkpoint carried by the cluster's object store (the nodes share no
    folder); then a 2-replica gang over both meets at one MASTER_ADDR:MASTER_PORT, and its
    next attempt at a new port. One cluster for both: it is the slow part."""
    image = asyncio.run(built_example_image())
    monkeypatch.setenv("DOCKER_HOST", DOCKER_HOST)  # the executors' engine (read by aiodocker)
    data = tmp_path / "fl"
    ports = test_embedded.port_flags()
    docker_nodes = ("--runtime", "docker", "--nodes", "2", "--gpus", "1")
    nodes: set[str] = set()
    try:
        fairlane("up", "--detach", *docker_nodes, *ports, data_dir=data)
        host = json.loads((data / "cluster.json").read_text())["node"]
        nodes = {host, f"{host}-2"}
        api = Api(resolve(None, None, data))
        fairlane("project", "set", "team", "--quota", "2", data_dir=data)
        train = ("python3", "/app/examples/train.py", "--steps=100000")
        image_job = ("--project", "team", "--class", "train", "--image", image)
        fairlane("submit", "train-1", *image_job, "--", *train, data_dir=data)
        [a] = eventually(lambda: job(api, 1), "attempt 1 runs")["nodes"]
        [b] = nodes - {a}
        drained(api, data, a, b)
        assert containers("train-1") == [b]
        carried_by_the_store(api, data, node_data(data, b, host))
        fairlane("delete", "train-1", data_dir=data)
        fairlane("node", "uncordon", a, data_dir=data)
        meets_as_a_gang(api, data, image_job, nodes)
    finally:
        fairlane("down", data_dir=data)
        for node in nodes:  # what a failed test may have left
            left = docker("ps", "-aq", "--filter", f"label=fairlane.node={node}").split()
            if left:
                docker("rm", "-f", *left, check=False)


async def built_example_image() -> str:
    """The image with examples/ and fairlane.workload in /app (tests/docker_support.py)."""
    client = await engine()
    try:
        return await example_image(client)
    finally:
        await client.close()


def containers(job_id: str) -> list[str]:
    """The nodes of the job's running containers, by the labels the executors give them."""
    label = '{{.Label "fairlane.node"}}'
    ps = docker("ps", "--filter", f"label=fairlane.job={job_id}", "--format", label)
    return sorted(ps.split())


def node_data(data: Path, node: str, host: str) -> Path:
    """A node's executor folder: the first node's is the cluster's, the others' their own."""
    return data / "executor" if node == host else data / "nodes" / node / "executor"


def carried_by_the_store(api: Api, data: Path, b_folder: Path) -> None:
    """Node a stored the replica's folder in the object store before it reported the stop; the
    bucket holds the object, and b's folder records the stored checkpoint it fetched."""
    [stop] = [e["event"] for e in timeline(api, type="JobPreempted")]
    assert stop["checkpointed"] and stop["stored_bytes"] > 0, stop
    assert (b_folder / "checkpoints" / "train-1" / "replica-0.stored").is_file()
    assert asyncio.run(stored_size(data, "train-1/replica-0")) > 0


async def stored_size(data: Path, name: str) -> int:
    info = json.loads((data / "cluster.json").read_text())
    creds = load_credentials(credentials_file(data, ADMIN))
    nc = await connect(info["nats_url"], "test", credentials=creds)
    try:
        found = await (await checkpoint_bucket(nc.jetstream())).get_info(name)
        return int(found.size or 0)
    finally:
        await nc.close()


#: what each replica of the gang prints from its environment
MEETS = 'echo "rank $RANK of $WORLD_SIZE, node $NODE_RANK, meets at $MASTER_ADDR:$MASTER_PORT"'
MET = re.compile(r"\[replica (\d)\] rank (\d) of (\d), node (\d), meets at (\S+):(\d+)")


def met(api: Api, attempt: int) -> list[tuple[str, ...]] | None:
    """What both replicas of `attempt` said, once both said it (the API's output of a gang
    prefixes each line with its replica)."""
    found = sorted(set(MET.findall(api.get_text("/v1/jobs/g2/logs", attempt=attempt))))
    return found if len(found) == 2 else None


def meets_as_a_gang(api: Api, data: Path, image_job: tuple[str, ...], nodes: set[str]) -> None:
    """One replica on each node, each told the same master (replica 0's node) and its rank;
    paused and resumed, the next attempt meets at another port."""
    gang = ("--replicas", "2", "--gpus", "1")
    meets = f"{MEETS}; exec sleep 600"
    fairlane("submit", "g2", *image_job, *gang, "--", "sh", "-c", meets, data_dir=data)
    first = eventually(lambda: met(api, 1), "both replicas of attempt 1 say where they meet")
    port = first[0][5]
    assert first == [(str(r), str(r), "2", str(r), "127.0.0.1", port) for r in (0, 1)]
    assert 29500 <= int(port) < 32768
    assert sorted(api.get("/v1/jobs/g2")["nodes"]) == containers("g2") == sorted(nodes)
    fairlane("pause", "g2", data_dir=data)
    eventually(lambda: api.get("/v1/jobs/g2")["state"] == "paused" or None, "g2 paused")
    fairlane("resume", "g2", data_dir=data)
    second = eventually(lambda: met(api, 2), "both replicas of attempt 2 say where they meet")
    assert len({line[5] for line in second}) == 1 and second[0][5] != port
    assert [line[:5] for line in second] == [line[:5] for line in first]
    assert not api.get("/v1/jobs/g2/timeline", type="JobFailed")["items"]


def test_a_plan_gains_and_loses_a_nodes_executor() -> None:
    args = ["-m", "services.executor", "--nats", "nats://x", "--node", "vm", "--pool", "default"]
    plan = Plan(
        programs=[Program("ledger", ["-m", "services.ledger"]), Program("executor", args)],
        log_dir="logs",
        status_file="status.json",
    )
    program = Program(
        "executor-gpu-2",
        executor_args(
            nats_url="nats://x",
            node="gpu-2",
            pool="a100",
            gpus=2,
            data_dir=Path("/d/nodes/gpu-2/executor"),
            runtime="process",
        ),
    )
    grown = with_program(plan, program)
    assert program_of(grown, "gpu-2") == program
    assert program_of(grown, "vm") == plan.programs[1]
    assert program_of(grown, "ledger") is None
    assert "--gpus" in program.args and program.args[program.args.index("--gpus") + 1] == "2"
    assert without_program(grown, "executor-gpu-2") == plan


def test_a_credentials_file_of_another_node_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    for user in (executor_user("gpu-3"), "admin"):
        path.write_text(json.dumps({"user": user, "password": "p", "inbox_prefix": "_INBOX_x"}))
        with pytest.raises(NodeError) as refused:
            credentials_for(path, "gpu-4")
        assert refused.value.code == 2
        assert f"--credentials {path} holds the NATS user {user!r}" in str(refused.value)
    path.write_text(json.dumps({"user": "executor-gpu-4", "password": "p", "inbox_prefix": "i"}))
    assert credentials_for(path, "gpu-4") == Credentials("executor-gpu-4", "p", "i")
    with pytest.raises(NodeError, match=r"--credentials .*missing\.json: No such file"):
        credentials_for(tmp_path / "missing.json", "gpu-4")
