"""The node executor's Docker runtime on a real Docker engine, with locally made images.

Needs the engine `.ci/dockerd` starts (see tests/docker_support.py); with `CI=true` these tests
fail rather than skip without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiodocker
import pytest
from aiodocker.exceptions import DockerError

from cluster.servers import NatsServer
from events import (
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobPreempted,
    JobProgress,
    JobStarted,
    NodeRegistered,
    Replica,
    VolumeMount,
)
from services.executor.executor import Executor
from services.executor.logs import attempt_logs
from tests.docker_support import DOCKER_HOST, engine, example_image
from tests.test_executor import Cluster, eventually, open_cluster

pytestmark = [pytest.mark.docker, pytest.mark.nats, pytest.mark.slow]


@dataclass
class Docker:
    client: aiodocker.Docker
    image: str
    node: str

    async def containers(self, job_id: str) -> list[dict[str, Any]]:
        listed = await self.client.containers.list(
            all=True, filters=f'{{"label": ["fairlane.node={self.node}", "fairlane.job={job_id}"]}}'
        )
        return [await c.show() for c in listed]


@pytest.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with open_cluster(nats_server, tmp_path) as c:
        yield c


@pytest.fixture
async def docker() -> AsyncIterator[Docker]:
    client = await engine()
    node = f"d{uuid.uuid4().hex[:8]}"
    try:
        yield Docker(client, await example_image(client), node)
    finally:
        for container in await client.containers.list(
            all=True, filters=f'{{"label": ["fairlane.node={node}"]}}'
        ):
            with contextlib.suppress(DockerError):  # the executor may be removing it already
                await container.delete(force=True)
        await client.close()


async def docker_executor(cluster: Cluster, docker: Docker, **kw: Any) -> Executor:
    kw.setdefault("runtime", "docker")
    return await cluster.executor(
        docker.node, gpus=2, docker_host=DOCKER_HOST, docker_network="none", **kw
    )


TRAIN = ("python3", "/app/examples/train.py", "--steps", "100000", "--step-seconds", "0.005")


async def test_a_job_preempted_in_docker_resumes_from_its_checkpoint(
    cluster: Cluster, docker: Docker
) -> None:
    ex = await docker_executor(cluster, docker)
    here = (Replica(docker.node, (1,)),)
    await cluster.job("dj", here, (*TRAIN, "--checkpoint-every", "40"), image=docker.image)
    await cluster.recorder.wait(JobStarted, "dj", within=60)

    [info] = await docker.containers("dj")
    host, config = info["HostConfig"], info["Config"]
    checkpoints = str(ex.data_dir / "checkpoints" / "dj" / "replica-0")
    assert host["Init"] is True
    assert f"{checkpoints}:{checkpoints}" in host["Binds"]
    assert not host.get("DeviceRequests")  # declared GPUs, not NVML's: nothing to request
    assert config["Labels"]["fairlane.job"] == "dj"
    assert config["Labels"]["fairlane.attempt"] == "1"
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["FAIRLANE_CHECKPOINT_DIR"] == checkpoints
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "0")

    await cluster.recorder.wait(JobProgress, "dj", within=30)
    await cluster.recorder.wait(JobCheckpointed, "dj", lambda e: e.step is not None, within=30)
    await cluster.preempt("dj")
    preempted = await cluster.recorder.wait(JobPreempted, "dj", within=30)
    assert preempted.checkpointed and not preempted.killed
    saved = [e.step for e in cluster.recorder.of(JobCheckpointed, "dj") if e.step is not None]
    last = saved[-1]
    assert last is not None and last > 0

    await cluster.job("dj", here, attempt=2)
    resumed = await cluster.recorder.wait(JobStarted, "dj", lambda e: e.attempt == 2, within=60)
    assert resumed.resumed
    said = await cluster.recorder.wait(JobMessage, "dj", lambda e: e.attempt == 2, within=30)
    assert said.text == f"resumed from step {last}"
    later = await cluster.recorder.wait(JobProgress, "dj", lambda e: e.attempt == 2, within=30)
    assert later.step is not None and later.step > last
    started = [e.attempt for e in cluster.recorder.of(JobStarted, "dj")]
    assert started == [1, 2]

    logs = {entry.attempt: entry.path for entry in attempt_logs(ex.data_dir, "dj")}
    assert sorted(logs) == [1, 2]
    assert f"stopping at step {last}" in logs[1].read_text()
    await eventually(lambda: f"resumed from step {last}" in logs[2].read_text())


async def test_a_container_that_ignores_sigterm_is_killed_after_the_grace(
    cluster: Cluster, docker: Docker
) -> None:
    await cluster.grace(1.0)
    await docker_executor(cluster, docker)
    stubborn = ("sh", "-c", "trap '' TERM; echo ready; sleep 60")
    await cluster.job("stubborn", (Replica(docker.node, (0,)),), stubborn, image=docker.image)
    await cluster.recorder.wait(JobStarted, "stubborn", within=60)
    asked = time.monotonic()
    await cluster.preempt("stubborn")
    preempted = await cluster.recorder.wait(JobPreempted, "stubborn", within=30)
    assert time.monotonic() - asked >= 1.0
    assert preempted.killed and not preempted.checkpointed
    assert not [c for c in await docker.containers("stubborn") if c["State"]["Running"]]


async def test_a_restarted_executor_finds_its_containers_by_label(
    cluster: Cluster, docker: Docker
) -> None:
    first = await docker_executor(cluster, docker, stop_workloads_on_exit=False)
    script = (
        'echo started >> "$FAIRLANE_CHECKPOINT_DIR/starts"; '
        'while [ ! -f "$FAIRLANE_CHECKPOINT_DIR/done" ]; do sleep 0.1; done'
    )
    await cluster.job(
        "kept", (Replica(docker.node, (0,)),), ("sh", "-c", script), image=docker.image
    )
    await cluster.recorder.wait(JobStarted, "kept", within=60)
    [before] = await docker.containers("kept")

    task, runner, log = next(run for run in cluster.runs if run[1] is first)
    runner.stop()
    await asyncio.wait_for(task, 15)
    await log.nc.close()
    cluster.runs.remove((task, runner, log))
    first.records_path.unlink()  # so only the labels can tell the next executor what runs
    [still] = await docker.containers("kept")
    assert still["State"]["Running"]

    second = await docker_executor(cluster, docker)
    await eventually(lambda: len(cluster.recorder.of(NodeRegistered)) == 2)
    [after] = await docker.containers("kept")
    assert after["Id"] == before["Id"]
    assert [lr.job_id for lr in second.local_replicas()] == ["kept"]
    checkpoints = second.data_dir / "checkpoints" / "kept" / "replica-0"
    (checkpoints / "done").touch()
    completed = await cluster.recorder.wait(JobCompleted, "kept", within=30)
    assert completed.actor == f"executor/{docker.node}"
    assert (checkpoints / "starts").read_text().splitlines() == ["started"]
    assert len(cluster.recorder.of(JobStarted, "kept")) == 1
    await eventually(lambda: not second.local_replicas())


async def test_an_image_or_command_that_cannot_run_fails_the_job_clearly(
    cluster: Cluster, docker: Docker
) -> None:
    await docker_executor(cluster, docker)
    node = docker.node
    await cluster.job("noimage", (Replica(node, (0,)),), ("true",), image="fairlane-test/absent:1")
    await cluster.job(
        "nocommand", (Replica(node, (1,)),), ("/no/such/command",), image=docker.image
    )
    failed = await cluster.recorder.wait(JobFailed, "noimage", within=60)
    assert failed.exit_code == 125
    assert "fairlane-test/absent:1" in failed.reason and "no such image" in failed.reason.lower()
    failed = await cluster.recorder.wait(JobFailed, "nocommand", within=60)
    assert failed.exit_code == 127
    assert "command was not found" in failed.reason and "/no/such/command" in failed.reason


async def test_a_job_reads_a_host_folder_read_only_and_a_symlink_out_is_refused(
    cluster: Cluster, docker: Docker, tmp_path: Path
) -> None:
    """Admission let both through (the allowlist is of paths); only the node sees that the
    second leads elsewhere through a symlink."""
    ex = await docker_executor(cluster, docker)
    shared, secret = tmp_path / "datasets", tmp_path / "secret"
    shared.mkdir()
    secret.mkdir()
    (shared / "hello.txt").write_text("hello from the node\n")
    (shared / "out").symlink_to(secret)
    reads = ("sh", "-c", "cat /in/hello.txt && ! touch /in/written 2>/dev/null")
    mounted = (VolumeMount(f"{shared}/", "/in"),)
    await cluster.job("reads", (Replica(docker.node, (0,)),), reads, image=docker.image,
                      volumes=mounted)  # fmt: skip
    sneaks = (VolumeMount(str(shared / "out"), "/in"),)
    await cluster.job("sneaks", (Replica(docker.node, (1,)),), ("true",), image=docker.image,
                      volumes=sneaks)  # fmt: skip
    await cluster.recorder.wait(JobCompleted, "reads", within=60)
    [log] = attempt_logs(ex.data_dir, "reads")
    await eventually(lambda: "hello from the node" in log.path.read_text())
    assert not (shared / "written").exists()
    failed = await cluster.recorder.wait(JobFailed, "sneaks", within=60)
    assert failed.exit_code == 125 and f"leads through a symlink to {secret}" in failed.reason
