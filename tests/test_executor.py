"""The node executor on a real nats-server, with real processes (and hollow ones).

Jobs are put on the log as the policy would (submitted, admitted, scheduled on this node); the
tests then watch what the executor does to processes and what it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from cluster.servers import NatsServer, free_ports
from events import (
    ClusterConfigured,
    ClusterSettings,
    Event,
    GpuDevice,
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobPreempted,
    JobPreemptionRequested,
    JobProgress,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PortMapping,
    Replica,
    VolumeMount,
    WorkRelayed,
)
from fairlane import workload
from policy.state import ClusterState
from services.executor.docker import ContainerHost, container_config
from services.executor.endpoint import BURST, RATE, Budget
from services.executor.gpus import GpuDiscoveryError, discover_gpus
from services.executor.logs import attempt_logs
from services.executor.runtime import Launch, load_records, proc_start_ticks
from services.executor.service import Executor, ExecutorConfig, ExecutorGroup
from services.executor.storage import CheckpointStorage, object_name
from services.nodewatch.service import NodeWatch
from services.nodewatch.work import rendezvous_port
from services.runtime.checkpoint_bucket import checkpoint_bucket
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.relays import relay_log
from services.runtime.tasks import cancel_and_wait
from tests.torch_support import require_torch

pytestmark = pytest.mark.nats
E = TypeVar("E", bound=Event)
POOL = "p"
WORKLOAD = (sys.executable, "-m", "services.executor.workload")


class Recorder:
    """Follows the log and the relay stream in the background and keeps every event, for
    `wait`."""

    def __init__(self, log: JetStreamLog) -> None:
        self.log = log
        self.events: list[Event] = []
        self.changed = asyncio.Condition()
        self.task = asyncio.create_task(self._follow_both())

    async def _follow_both(self) -> None:
        await asyncio.gather(self._follow(self.log), self._follow(relay_log(self.log)))

    async def _follow(self, log: JetStreamLog) -> None:
        async for stored in log.follow(1):
            async with self.changed:
                self.events.append(stored.event)
                self.changed.notify_all()

    def of(self, kind: type[E], job_id: str | None = None) -> list[E]:
        return [
            e
            for e in self.events
            if isinstance(e, kind) and (job_id is None or getattr(e, "job_id", None) == job_id)
        ]

    async def wait(
        self,
        kind: type[E],
        job_id: str | None = None,
        where: Callable[[E], bool] = lambda e: True,
        within: float = 10.0,
    ) -> E:
        async def found() -> E:
            async with self.changed:
                while True:
                    for e in self.of(kind, job_id):
                        if where(e):
                            return e
                    await self.changed.wait()

        try:
            return await asyncio.wait_for(found(), within)
        except TimeoutError:
            seen = [f"{type(e).__name__}({e.id})" for e in self.events]
            if self.task.done():
                seen.append(f"recorder ended: {self.task.exception()!r}")
            raise AssertionError(
                f"no {kind.__name__} for {job_id} within {within}s: {seen}"
            ) from None


class Cluster:
    """A test's view of the cluster: its own log connection, a recorder, executors, and a
    node watcher that relays their work (its heartbeat timeout too long to lose a node;
    `watch=False`: the test runs its own)."""

    def __init__(self, server: NatsServer, tmp: Path, watch: bool = True) -> None:
        self.server = server
        self.tmp = tmp
        self.watch = watch
        self.runs: list[tuple[asyncio.Task[None], Executor | ExecutorGroup, JetStreamLog]] = []
        self.watcher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self.log = JetStreamLog(await connect(self.server.url, "test"))
        await self.log.ensure_stream()
        await relay_log(self.log).ensure_stream()
        self.recorder = Recorder(self.log)
        if self.watch:
            self.watch_log = JetStreamLog(await connect(self.server.url, "nodewatch"))
            self.watcher = asyncio.create_task(NodeWatch(self.watch_log, timeout_s=3600).run())
        await self.publish(
            ClusterConfigured(
                id="cluster",
                time=time.time(),
                actor="t",
                settings=ClusterSettings(preemption_grace_s=5.0),
            )
        )

    async def publish(self, event: Event) -> None:
        await self.log.publish(event)

    async def grace(self, seconds: float) -> None:
        await self.publish(
            ClusterConfigured(
                id=f"grace-{seconds}",
                time=time.time(),
                actor="t",
                settings=ClusterSettings(preemption_grace_s=seconds),
            )
        )

    def config(self, node: str, gpus: int = 2, **kw: Any) -> ExecutorConfig:
        kw.setdefault("data_dir", self.tmp / node)
        kw.setdefault("checkpoint_poll_s", 0.2)
        kw.setdefault("stop_workloads_on_exit", True)
        return ExecutorConfig(node=node, pool=POOL, gpus=gpus, **kw)

    async def executor(self, node: str, gpus: int = 2, **kw: Any) -> Executor:
        log = JetStreamLog(await connect(self.server.url, f"executor-{node}"))
        executor = Executor(log, self.config(node, gpus, **kw))
        await self._run(executor, log)
        return executor

    async def group(self, configs: list[ExecutorConfig]) -> ExecutorGroup:
        log = JetStreamLog(await connect(self.server.url, "executors"))
        group = ExecutorGroup(log, [Executor(log, c) for c in configs])
        await self._run(group, log)
        return group

    async def _run(self, runner: Executor | ExecutorGroup, log: JetStreamLog) -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(runner.run(ready))
        await asyncio.wait_for(ready.wait(), 10)
        self.runs.append((task, runner, log))

    async def job(
        self,
        job_id: str,
        replicas: tuple[Replica, ...],
        command: tuple[str, ...] = (),
        attempt: int = 1,
        elastic_to: int | None = None,
        image: str | None = None,
        working_dir: str | None = None,
        ports: tuple[PortMapping, ...] = (),
        volumes: tuple[VolumeMount, ...] = (),
    ) -> None:
        """Submitted, admitted and placed on `replicas`, as the policy would (`elastic_to`:
        the job may grow to that many replicas)."""
        now = time.time()
        size = elastic_to or len(replicas)
        if attempt == 1:
            spec = JobSpec(
                project="a",
                replicas=size,
                command=command,
                image=image,
                working_dir=working_dir,
                ports=ports,
                volumes=volumes,
            )
            await self.publish(
                JobSubmitted(
                    id=f"{job_id}/submitted", time=now, actor="t", job_id=job_id, spec=spec
                )
            )
            await self.publish(
                JobAdmitted(
                    id=f"{job_id}/admitted",
                    time=now,
                    actor="t",
                    job_id=job_id,
                    project="a",
                    priority=50,
                    preemptible=True,
                    gpus=len(replicas[0].gpus),
                    replicas=size,
                    min_replicas=len(replicas),
                    pools=(POOL,),
                )
            )
        await self.publish(
            JobScheduled(
                id=f"{job_id}/{attempt}/scheduled",
                time=now,
                actor="t",
                job_id=job_id,
                attempt=attempt,
                pool=POOL,
                replicas=replicas,
            )
        )

    async def preempt(self, job_id: str, attempt: int = 1, replicas: int = 0) -> str:
        event_id = f"{job_id}/{attempt}/preempt"
        await self.publish(
            JobPreemptionRequested(
                id=event_id,
                time=time.time(),
                actor="t",
                job_id=job_id,
                attempt=attempt,
                reason="priority",
                replicas=replicas,
            )
        )
        return event_id

    async def close(self) -> None:
        for task, runner, _ in self.runs:
            if task.done():  # an executor that stopped by itself failed
                task.result()
            runner.stop()
        await asyncio.wait_for(asyncio.gather(*(task for task, _, _ in self.runs)), 15)
        for _, _, log in self.runs:
            await log.nc.close()
        await cancel_and_wait(self.recorder.task)
        if self.watcher is not None:
            await cancel_and_wait(self.watcher)
            await self.watch_log.nc.close()
        await self.log.nc.close()


@contextlib.asynccontextmanager
async def open_cluster(
    nats_server: NatsServer, tmp_path: Path, watch: bool = True
) -> AsyncIterator[Cluster]:
    c = Cluster(nats_server, tmp_path, watch)
    await c.open()
    try:
        yield c
    finally:
        await c.close()
        kill_recorded(tmp_path)


@pytest.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with open_cluster(nats_server, tmp_path) as c:
        yield c


def kill_recorded(root: Path) -> None:
    """Whatever a test left running (a failed test, an executor killed with -9)."""
    for path in root.glob("*/processes.json"):
        for record in load_records(path):
            if record.pid and proc_start_ticks(record.pid) == record.start_ticks:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pid, signal.SIGKILL)


def of_attempt(attempt: int) -> Callable[[JobStarted | JobPreempted], bool]:
    """A `Recorder.wait` condition: the event is of this attempt."""
    return lambda e: e.attempt == attempt


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def alive(pid: int) -> bool:
    return proc_start_ticks(pid) is not None


# -- GPUs ----------------------------------------------------------------------------------------


def fake_nvml(gpus: int | None) -> ModuleType:
    """A stand-in for pynvml: `gpus` devices, or no driver at all (None)."""
    nvml = ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def init() -> None:
        if gpus is None:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}".encode()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: b"Test GPU"  # type: ignore[attr-defined]
    memory = ModuleType("memory")
    memory.total = 80 << 30  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: memory  # type: ignore[attr-defined]
    return nvml


def test_gpus_come_from_nvml_or_the_declared_count() -> None:
    found = discover_gpus(None, nvml=fake_nvml(2))
    assert (found.count, found.uuids, found.source) == (2, ("GPU-0", "GPU-1"), "nvml")
    assert found.devices[1] == GpuDevice(index=1, uuid="GPU-1", model="Test GPU", memory_mb=81920)
    # a declared count overrides NVML, and is the fallback where there is no driver
    assert discover_gpus(4, nvml=fake_nvml(2)).count == 4
    declared = discover_gpus(2, nvml=fake_nvml(None))
    assert (declared.count, declared.uuids, declared.source) == (2, (), "declared")
    with pytest.raises(GpuDiscoveryError, match="NVMLError_LibraryNotFound"):
        discover_gpus(None, nvml=fake_nvml(None))


def test_nvml_describes_this_machines_gpus() -> None:
    """The real NVML, where there is an NVIDIA driver (skipped elsewhere: CI has no GPU)."""
    import pynvml  # noqa: PLC0415

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        pytest.skip(f"no NVIDIA driver here ({type(e).__name__})")
    found = discover_gpus(None)
    assert found.source == "nvml" and found.count == len(found.devices) > 0
    assert [d.index for d in found.devices] == list(range(found.count))
    assert all(d.uuid.startswith("GPU-") and d.model and d.memory_mb > 0 for d in found.devices)


# -- processes -----------------------------------------------------------------------------------


async def test_registers_and_runs_each_replica_with_its_environment(cluster: Cluster) -> None:
    ex = await cluster.executor("n1", gpus=2)
    registered = await cluster.recorder.wait(NodeRegistered)
    assert (registered.node, registered.pool, registered.gpus) == ("n1", POOL, 2)
    assert registered.gpu_source == "declared" and not registered.gpu_devices

    out = '"$FAIRLANE_CHECKPOINT_DIR/env-$FAIRLANE_REPLICA.txt"'
    command = ("sh", "-c", f"env > {out}.tmp && mv {out}.tmp {out}; sleep 30")
    await cluster.job("j1", (Replica("n1", (0,)), Replica("n1", (1,))), command)
    started = await cluster.recorder.wait(JobStarted, "j1")
    assert (started.id, started.attempt, started.resumed) == ("j1/1/started", 1, False)

    ckpt = cluster.tmp / "n1" / "checkpoints" / "j1"
    own = [ckpt / f"replica-{i}" for i in (0, 1)]  # each replica its own checkpoint folder
    await eventually(lambda: all((own[i] / f"env-{i}.txt").exists() for i in (0, 1)))
    for index in (0, 1):
        env = read_env(own[index] / f"env-{index}.txt")
        assert env["FAIRLANE_JOB_ID"] == "j1"
        assert env["FAIRLANE_ATTEMPT"] == "1"
        assert env["FAIRLANE_CHECKPOINT_DIR"] == str(own[index].resolve())
        assert env["FAIRLANE_REPLICA"] == str(index)
        assert env["CUDA_VISIBLE_DEVICES"] == str(index)
        assert "FAIRLANE_RESUMED" not in env
    records = load_records(cluster.tmp / "n1" / "processes.json")
    assert sorted((r.job_id, r.replica) for r in records) == [("j1", 0), ("j1", 1)]
    pids = [r.pid for r in records]
    assert all(alive(pid) for pid in pids)

    # `sh` does not save anything: stopped by SIGTERM, not checkpointed
    request = await cluster.preempt("j1")
    preempted = await cluster.recorder.wait(JobPreempted, "j1")
    assert (preempted.id, preempted.checkpointed, preempted.causation) == (
        f"{request}/done",
        False,
        request,
    )
    assert not any(alive(pid) for pid in pids)
    await eventually(lambda: not ex.attempts)
    assert load_records(cluster.tmp / "n1" / "processes.json") == []


async def test_preemption_saves_a_checkpoint_and_the_next_attempt_resumes(
    cluster: Cluster,
) -> None:
    await cluster.executor("n1", gpus=1)
    command = (*WORKLOAD, "--step-seconds", "0.05", "--checkpoint-every", "0.3")
    await cluster.job("j2", (Replica("n1", (0,)),), command)
    await cluster.recorder.wait(JobStarted, "j2")
    checkpoint = await cluster.recorder.wait(JobCheckpointed, "j2")
    assert (checkpoint.id, checkpoint.attempt) == ("j2/1/checkpoint/1", 1)

    asked = time.monotonic()
    await cluster.preempt("j2")
    preempted = await cluster.recorder.wait(JobPreempted, "j2")
    assert preempted.checkpointed
    assert time.monotonic() - asked < 5.0  # it saved and exited on SIGTERM, no SIGKILL needed
    state_file = cluster.tmp / "n1" / "checkpoints" / "j2" / "replica-0" / "state.json"
    first = read_json(state_file)
    assert first["attempt"] == 1 and first["step"] > 0

    await cluster.job("j2", (Replica("n1", (0,)),), attempt=2)
    resumed = await cluster.recorder.wait(JobStarted, "j2", lambda e: e.attempt == 2)
    assert resumed.resumed
    await cluster.recorder.wait(JobCheckpointed, "j2", lambda e: e.attempt == 2)
    (state_file.parent / ".exit").write_text("0")
    done = await cluster.recorder.wait(JobCompleted, "j2")
    assert done.attempt == 2
    second = read_json(state_file)
    assert second["attempt"] == 2
    assert second["resumed_from"] == first["step"]
    assert second["step"] > first["step"]


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def test_a_workload_that_ignores_sigterm_is_killed_after_the_grace(
    cluster: Cluster,
) -> None:
    await cluster.grace(0.5)
    await cluster.executor("n1", gpus=1)
    command = ("sh", "-c", "trap '' TERM; echo $$ > \"$FAIRLANE_CHECKPOINT_DIR/pid\"; sleep 30")
    await cluster.job("j3", (Replica("n1", (0,)),), command)
    await cluster.recorder.wait(JobStarted, "j3")
    pid_file = cluster.tmp / "n1" / "checkpoints" / "j3" / "replica-0" / "pid"
    # the shell creates the file before it writes the pid in it
    await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    pid = int(pid_file.read_text())

    asked = time.monotonic()
    await cluster.preempt("j3")
    preempted = await cluster.recorder.wait(JobPreempted, "j3")
    assert time.monotonic() - asked >= 0.5
    assert not preempted.checkpointed
    assert not alive(pid)


async def test_exit_codes_complete_or_fail_the_job(cluster: Cluster) -> None:
    await cluster.executor("n1", gpus=2)
    await cluster.job("ok", (Replica("n1", (0,)),))  # the built-in workload
    await cluster.job("bad", (Replica("n1", (1,)),), ("sh", "-c", "exit 3"))
    failed = await cluster.recorder.wait(JobFailed, "bad")
    assert (failed.id, failed.attempt, failed.exit_code) == ("bad/1/failed", 1, 3)
    await cluster.recorder.wait(JobStarted, "ok")
    (cluster.tmp / "n1" / "checkpoints" / "ok" / ".exit").write_text("0")
    completed = await cluster.recorder.wait(JobCompleted, "ok")
    assert completed.id == "ok/1/completed"
    assert not cluster.recorder.of(JobFailed, "ok")


async def test_a_node_forgets_the_reports_of_jobs_done_with_it(cluster: Cluster) -> None:
    """A node keeps the ids of its reports (it asks them before reporting again) only while a
    job has work or replicas here: kept for good, they grew with every job the node ran."""
    executor = await cluster.executor("n1", gpus=2)
    actuator = executor.actuator
    await cluster.job("bad", (Replica("n1", (0,)),), ("sh", "-c", "exit 3"))
    await cluster.job("keep", (Replica("n1", (1,)),))
    await cluster.recorder.wait(JobFailed, "bad")
    await cluster.recorder.wait(JobStarted, "keep")
    await eventually(lambda: "bad" not in actuator.reports_of)
    assert not {i for i in actuator.reported | actuator.published if i.startswith("bad/")}
    # the running job's reports stay: its stop is still to be reported once
    assert actuator.reports_of["keep"] == ["keep/1/started"]
    assert "keep/1/started" in actuator.published
    await cluster.preempt("keep")
    await cluster.recorder.wait(JobPreempted, "keep")
    await eventually(lambda: not actuator.reports_of)
    assert not {i for i in actuator.reported if i.startswith(("bad/", "keep/"))}
    assert not cluster.recorder.of(JobStarted, "bad")[1:]  # nothing reported twice
    assert len(cluster.recorder.of(JobPreempted, "keep")) == 1


async def test_a_restarted_executor_adopts_reports_and_cleans_up(cluster: Cluster) -> None:
    """kill -9 of the executor with four workloads running; while it is down, one exits 3,
    one is killed with its shim (no exit status left), and the log ends a third one. The
    restarted executor reports the first two, kills the third and adopts the fourth."""
    data = cluster.tmp / "n1"
    argv = [sys.executable, "-m", "services.executor", "--nats", cluster.server.url]
    argv += ["--node", "n1", "--pool", POOL, "--gpus", "4", "--data-dir", str(data)]
    # adoption is the point here; workloads as users of their own: tests/test_tenant.py (and
    # pytest's folder, 0700, is no place the workloads' users could enter)
    argv += ["--insecure-same-user"]
    output = (cluster.tmp / "executor.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdout=output, stderr=output)

    script = (
        'echo started >> "$FAIRLANE_CHECKPOINT_DIR/starts"; '
        'while [ ! -f "$FAIRLANE_CHECKPOINT_DIR/done" ]; do sleep 0.05; done; exit {code}'
    )
    jobs = {"keep": 0, "down": 3, "lost": 0, "stale": 0}
    executor = start()
    try:
        await cluster.recorder.wait(NodeRegistered, within=20)
        for gpu, (job_id, code) in enumerate(jobs.items()):
            command = ("sh", "-c", script.format(code=code))
            await cluster.job(job_id, (Replica("n1", (gpu,)),), command)
        for job_id in jobs:
            await cluster.recorder.wait(JobStarted, job_id)
        pids = {r.job_id: r.pid for r in load_records(data / "processes.json")}
        assert sorted(pids) == sorted(jobs)

        executor.kill()  # kill -9: no chance to clean up
        executor.wait()
        # `down` ends while nobody watches; its shim leaves the exit status behind
        (data / "checkpoints" / "down" / "replica-0" / "done").touch()
        await eventually((data / "runs" / "down" / "1.0.exit").exists)
        # `lost` dies with its shim: no exit status at all
        os.killpg(pids["lost"], signal.SIGKILL)
        # someone else ends `stale` in the log
        await cluster.publish(
            JobCompleted(
                id="stale/1/completed", time=time.time(), actor="t", job_id="stale", attempt=1
            )
        )

        executor = start()
        await eventually(lambda: len(cluster.recorder.of(NodeRegistered)) == 2, within=20)
        failed = await cluster.recorder.wait(JobFailed, "down", within=20)
        assert (failed.exit_code, failed.actor) == (3, "executor/n1")
        lost = await cluster.recorder.wait(JobPreempted, "lost")
        # its node's own replicas: a gang's other nodes would report theirs under their names
        assert (lost.id, lost.reason, lost.own_replicas) == ("lost/1/lost/n1", "node_lost", True)
        await eventually(lambda: not alive(pids["stale"]))
        # reconciliation is done (it reported `down`): `keep` was adopted, not started again
        assert alive(pids["keep"])
        (data / "checkpoints" / "keep" / "replica-0" / "done").touch()
        completed = await cluster.recorder.wait(JobCompleted, "keep")
        assert completed.attempt == 1
        assert (
            data / "checkpoints" / "keep" / "replica-0" / "starts"
        ).read_text().splitlines() == ["started"]
        assert len(cluster.recorder.of(JobStarted, "keep")) == 1
        assert len(cluster.recorder.of(JobCompleted)) == 2  # keep, and stale by someone else
        assert not cluster.recorder.of(JobFailed, "stale")
        await eventually(lambda: load_records(data / "processes.json") == [])
    finally:
        executor.send_signal(signal.SIGTERM)
        try:
            assert executor.wait(10) == 0  # a clean exit on SIGTERM
        finally:
            executor.kill()
            output.close()


async def test_a_gang_over_two_nodes_grows_and_stops_on_both(cluster: Cluster) -> None:
    n1 = await cluster.executor("n1", gpus=2)
    n2 = await cluster.executor("n2", gpus=2)
    command = ("sh", "-c", 'echo "$FAIRLANE_REPLICA" > "$FAIRLANE_CHECKPOINT_DIR/r-$$"; sleep 30')
    await cluster.job("g", (Replica("n1", (0,)), Replica("n2", (1,))), command, elastic_to=3)
    started = await cluster.recorder.wait(JobStarted, "g")
    assert started.actor == "executor/n1"  # the first replica's node reports
    await cluster.publish(
        JobScheduled(
            id="g/1/scale/3",
            time=time.time(),
            actor="t",
            job_id="g",
            attempt=1,
            pool=POOL,
            replicas=(Replica("n2", (0,)),),
            scale_up=True,
        )
    )
    await eventually(lambda: len(n2.local_replicas()) == 2)
    replicas = cluster.tmp / "n2" / "checkpoints" / "g"
    await eventually(lambda: len(list(replicas.glob("replica-*/r-*"))) == 2)
    assert sorted(p.parent.name for p in replicas.glob("replica-*/r-*")) == [
        "replica-1",
        "replica-2",
    ]
    assert sorted(p.read_text().strip() for p in replicas.glob("replica-*/r-*")) == ["1", "2"]
    pids = [r.pid for ex in (n1, n2) for r in load_records(ex.records_path)]
    assert len(pids) == 3 and all(alive(pid) for pid in pids)

    await cluster.preempt("g")
    await eventually(lambda: len(cluster.recorder.of(JobPreempted, "g")) == 2)
    await eventually(lambda: not any(alive(pid) for pid in pids))
    await eventually(lambda: not n1.attempts and not n2.attempts)
    # each node reports its own replicas, once they stopped and stored: the stop's first node
    # under the stop's id, the other under it and its name
    reports = {
        (e.id, e.actor, e.replicas, e.own_replicas) for e in cluster.recorder.of(JobPreempted, "g")
    }
    assert reports == {
        ("g/1/preempt/done", "executor/n1", 0, True),
        ("g/1/preempt/done/n2", "executor/n2", 0, True),
    }


async def test_a_stop_of_some_replicas_over_two_nodes_is_reported_by_each(
    cluster: Cluster,
) -> None:
    """Two of an elastic job's four replicas, one on each node, asked to stop: each node
    reports its own once stopped and stored (the stop's first node under its answer's id, the
    other under it and its name), so neither's GPU is given back while it still stores."""
    n1 = await cluster.executor("n1", gpus=2)
    n2 = await cluster.executor("n2", gpus=2)
    four = (Replica("n1", (0,)), Replica("n2", (0,)), Replica("n1", (1,)), Replica("n2", (1,)))
    await cluster.job("e", four, ("sleep", "30"))
    await cluster.recorder.wait(JobStarted, "e")
    await cluster.preempt("e", replicas=2)
    await eventually(lambda: len(cluster.recorder.of(JobPreempted, "e")) == 2)
    reports = {
        (e.id, e.actor, e.replicas, e.own_replicas) for e in cluster.recorder.of(JobPreempted, "e")
    }
    assert reports == {
        ("e/1/preempt/done", "executor/n1", 1, True),
        ("e/1/preempt/done/n2", "executor/n2", 1, True),
    }
    job = folded(cluster.recorder.events).jobs["e"]
    assert (job.phase, job.held, job.stop_replicas, job.preemptions) == (
        "running",
        list(four[:2]),
        0,
        1,
    )
    assert all(len(ex.local_replicas()) == 1 for ex in (n1, n2))  # the others run on


def stopped_and_resumed(ex: Executor, job_id: str) -> tuple[int | None, int | None]:
    """The step examples/train.py said it stopped at in attempt 1 and resumed from in 2."""
    stopped = resumed = None
    for entry in attempt_logs(ex.data_dir, job_id):
        for line in entry.path.read_text().splitlines():
            if "stopping at step " in line:
                stopped = int(line.split("stopping at step ")[1].split()[0])
            if "resumed from step " in line:
                resumed = int(line.split("resumed from step ")[1].split()[0])
    return stopped, resumed


async def test_a_job_checkpointed_on_one_node_resumes_on_another_from_its_step(
    cluster: Cluster,
) -> None:
    """The built-in storage: node A stores the replica's folder in the cluster's object store
    as it stops (before reporting the stop); node B fetches it before the next attempt starts
    there, and the workload resumes from the step it saved on A."""
    a = await cluster.executor("n1", gpus=1)
    b = await cluster.executor("n2", gpus=1)
    train = (*TRAIN, "--steps", "100000", "--step-seconds", "0.002", "--checkpoint-every", "50")
    await cluster.job("mv", (Replica("n1", (0,)),), train)
    await cluster.recorder.wait(JobCheckpointed, "mv", lambda e: e.step is not None)
    await cluster.preempt("mv")
    preempted = await cluster.recorder.wait(JobPreempted, "mv")
    assert preempted.checkpointed and preempted.stored_bytes and preempted.stored_bytes > 0
    stopped, _ = stopped_and_resumed(a, "mv")
    assert stopped is not None and stopped > 0

    await cluster.job("mv", (Replica("n2", (0,)),), attempt=2)
    said = await cluster.recorder.wait(JobMessage, "mv", lambda e: e.attempt == 2)
    assert said.text == f"resumed from step {stopped}"
    assert stopped_and_resumed(b, "mv") == (None, stopped)
    saved = read_json(b.checkpoints_root / "mv" / "replica-0" / "train.json")
    assert saved["step"] >= stopped
    assert not (b.checkpoints_root / "mv" / "replica-0" / ".checkpoint").exists()


async def test_a_lost_nodes_job_resumes_elsewhere_from_its_last_stored_checkpoint(
    cluster: Cluster,
) -> None:
    """A replica's periodic saves are stored as they happen (the marker, here): when its node
    is lost, the next attempt on another node starts from the last one stored."""
    await cluster.executor("n1", gpus=1)
    b = await cluster.executor("n2", gpus=1)
    command = (*WORKLOAD, "--step-seconds", "0.05", "--checkpoint-every", "0.3")
    await cluster.job("lost", (Replica("n1", (0,)),), command)
    checkpoint = await cluster.recorder.wait(JobCheckpointed, "lost")
    assert checkpoint.size_bytes and checkpoint.size_bytes > 0  # what the store holds
    await cluster.publish(
        NodeLost(id="n1/lost", time=time.time(), actor="t", node="n1", reason="test")
    )
    await cluster.job("lost", (Replica("n2", (0,)),), attempt=2)
    await cluster.recorder.wait(JobStarted, "lost", lambda e: e.attempt == 2)
    state = b.checkpoints_root / "lost" / "replica-0" / "state.json"
    await eventually(lambda: state.exists() and read_json(state)["attempt"] == 2)
    resumed = read_json(state)
    assert resumed["resumed_from"] and resumed["resumed_from"] > 0


async def stop_executor(cluster: Cluster, executor: Executor) -> None:
    """Stop one executor as SIGTERM does (`run()` returns once it closed)."""
    task = next(task for task, runner, _ in cluster.runs if runner is executor)
    executor.stop()
    await asyncio.wait_for(task, 30)


def folded(events: list[Event]) -> ClusterState:
    state = ClusterState()
    state.apply_all(events)
    return state


async def test_a_shut_down_executor_reports_its_jobs_stopped_and_they_resume(
    cluster: Cluster,
) -> None:
    """`--shutdown-on-exit` (what `fairlane down` stops): the executor stops its job as a
    preemption does, stores its checkpoint and reports `JobPreempted(reason="shutdown")`; the
    fold queues the job again (not failed, not counted as a preemption), and the next attempt
    resumes from the step it stopped at."""
    first = await cluster.executor("n1", gpus=1, shutdown_on_exit=True)
    train = (*TRAIN, "--steps", "100000", "--step-seconds", "0.002", "--checkpoint-every", "50")
    await cluster.job("sd", (Replica("n1", (0,)),), train)
    await cluster.recorder.wait(JobCheckpointed, "sd", lambda e: e.step is not None)
    await stop_executor(cluster, first)

    stopped = await cluster.recorder.wait(JobPreempted, "sd")
    assert (stopped.id, stopped.reason, stopped.attempt) == ("sd/1/shutdown", "shutdown", 1)
    assert stopped.checkpointed and stopped.stored_bytes and stopped.stored_bytes > 0
    assert not cluster.recorder.of(JobFailed, "sd")
    job = folded(cluster.recorder.events).jobs["sd"]
    assert (job.phase, job.held, job.preemptions) == ("pending", [], 0)
    assert not (cluster.tmp / "n1" / "shutdown.json").exists()  # reported: nothing left over
    step, _ = stopped_and_resumed(first, "sd")
    assert step is not None and step > 0

    again = await cluster.executor("n1", gpus=1)
    await cluster.job("sd", (Replica("n1", (0,)),), attempt=2)
    said = await cluster.recorder.wait(JobMessage, "sd", lambda e: e.attempt == 2)
    assert said.text == f"resumed from step {step}"
    assert stopped_and_resumed(again, "sd")[1] == step


async def test_a_shut_down_that_could_not_report_is_reported_when_the_node_comes_back(
    cluster: Cluster,
) -> None:
    """The log was gone before the executor could report the stop: the next executor on the
    node finds the attempt still running in the log, its workload ended by SIGTERM (exit 143)
    and the shut down's note naming it, and reports it stopped for the shut down, at the time
    it was stopped, rather than failed."""
    first = await cluster.executor("n1", gpus=1, shutdown_on_exit=True)
    command = (*WORKLOAD, "--step-seconds", "0.05", "--checkpoint-every", "0.3")
    await cluster.job("cut", (Replica("n1", (0,)),), command)
    await cluster.recorder.wait(JobCheckpointed, "cut")
    publish = first.actuator.publish

    async def log_gone(event: Event, give_up_after: float = 300.0) -> None:
        if isinstance(event, JobPreempted):
            raise ConnectionError("the log went away")
        await publish(event, give_up_after)

    first.actuator.publish = log_gone  # type: ignore[method-assign]
    began = time.time()
    await stop_executor(cluster, first)
    exit_file = cluster.tmp / "n1" / "runs" / "cut" / "1.0.exit"
    assert exit_file.read_text().strip() == "143"  # it saved and exited on SIGTERM
    assert (cluster.tmp / "n1" / "shutdown.json").exists()
    assert not cluster.recorder.of(JobPreempted, "cut")

    await asyncio.sleep(1.0)  # the cluster is down a while
    back = time.time()
    await cluster.executor("n1", gpus=1)
    stopped = await cluster.recorder.wait(JobPreempted, "cut")
    assert (stopped.reason, stopped.actor, stopped.checkpointed) == (
        "shutdown",
        "executor/n1",
        True,
    )
    assert began <= stopped.time < back  # when it was stopped, not when the node came back
    assert not cluster.recorder.of(JobFailed, "cut")
    assert folded(cluster.recorder.events).jobs["cut"].phase == "pending"
    await eventually(lambda: not (cluster.tmp / "n1" / "shutdown.json").exists())


async def test_a_checkpoint_over_the_bound_is_not_stored_and_the_timeline_says_so(
    cluster: Cluster,
) -> None:
    """A small save is stored; a later one over the bound is not, the timeline names its size
    and the bound, and the store still holds the small one whole (nothing half-written)."""
    bounded = CheckpointStorage("object_store", None, max_bytes=30_000)
    await cluster.executor("n1", gpus=1, checkpoint_storage=bounded)
    save = 'cd "$FAIRLANE_CHECKPOINT_DIR" && head -c {} /dev/zero > {} && touch .checkpoint'
    script = f"{save.format(100, 'small')}; sleep 1; {save.format(100_000, 'big')}; sleep 30"
    await cluster.job("big", (Replica("n1", (0,)),), ("sh", "-c", script))
    stored = await cluster.recorder.wait(JobCheckpointed, "big", lambda e: bool(e.size_bytes))
    said = await cluster.recorder.wait(JobMessage, "big")
    size = re.search(
        r"is (\d+) bytes, over the bound of 30000 \(--checkpoint-max-bytes\)", said.text
    )
    assert size and int(size[1]) > 100_000 and "not stored" in said.text, said.text
    assert said.actor == "executor/n1"
    refused = await cluster.recorder.wait(JobCheckpointed, "big", lambda e: e.refused)
    assert refused.size_bytes == int(size[1])  # the size refused, not the one stored before
    bucket = await checkpoint_bucket(cluster.log.js)
    kept = await bucket.get(object_name("big", 0))  # checks the digest
    assert kept.info.size == stored.size_bytes
    with tarfile.open(fileobj=io.BytesIO(kept.data or b"")) as tar:
        assert [m.name for m in tar.getmembers() if m.isfile()] == ["small"]


async def test_a_shared_folder_holds_the_checkpoints_of_every_node(cluster: Cluster) -> None:
    shared = CheckpointStorage("shared_fs", cluster.tmp / "shared")
    a = await cluster.executor("n1", gpus=1, checkpoint_storage=shared)
    b = await cluster.executor("n2", gpus=1, checkpoint_storage=shared)
    assert a.checkpoints_root == b.checkpoints_root == (cluster.tmp / "shared").resolve()
    assert a.actuator.objects is None and b.actuator.objects is None  # nothing is copied
    train = (*TRAIN, "--steps", "100000", "--step-seconds", "0.002", "--checkpoint-every", "50")
    await cluster.job("sh", (Replica("n1", (0,)),), train)
    await cluster.recorder.wait(JobCheckpointed, "sh", lambda e: e.step is not None)
    await cluster.preempt("sh")
    preempted = await cluster.recorder.wait(JobPreempted, "sh")
    assert preempted.checkpointed and preempted.stored_bytes is None
    stopped, _ = stopped_and_resumed(a, "sh")
    await cluster.job("sh", (Replica("n2", (0,)),), attempt=2)
    said = await cluster.recorder.wait(JobMessage, "sh", lambda e: e.attempt == 2)
    assert said.text == f"resumed from step {stopped}"


RENDEZVOUS = (
    "FAIRLANE_REPLICA",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
)


async def test_every_replica_of_a_gang_over_two_nodes_meets_at_the_same_master(
    cluster: Cluster,
) -> None:
    """Two executors (two nodes on this machine, one registering another address): each
    replica of an attempt gets the same MASTER_ADDR:MASTER_PORT (replica 0's node's address)
    and its own rank; the next attempt meets at a new port."""
    await cluster.executor("n1", gpus=1)
    await cluster.executor("n2", gpus=1, address="127.0.0.2")
    await eventually(lambda: len(cluster.recorder.of(NodeRegistered)) == 2)
    assert {e.node: e.address for e in cluster.recorder.of(NodeRegistered)} == {
        "n1": "127.0.0.1",
        "n2": "127.0.0.2",
    }
    out = '"$FAIRLANE_CHECKPOINT_DIR/env-$FAIRLANE_ATTEMPT"'
    command = ("sh", "-c", f"env > {out}.tmp && mv {out}.tmp {out}; sleep 30")

    async def environments(attempt: int, gang: tuple[Replica, ...]) -> list[dict[str, str]]:
        files = [
            cluster.tmp / r.node / "checkpoints" / "g2" / f"replica-{i}" / f"env-{attempt}"
            for i, r in enumerate(gang)
        ]
        await eventually(lambda: all(f.exists() for f in files))
        return [{k: v for k, v in read_env(f).items() if k in RENDEZVOUS} for f in files]

    first = (Replica("n1", (0,)), Replica("n2", (0,)))
    await cluster.job("g2", first, command)
    one = await environments(1, first)
    port = one[0]["MASTER_PORT"]
    assert one == [
        {
            "FAIRLANE_REPLICA": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "NODE_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "1",
        }
        for rank in (0, 1)
    ]
    assert 29500 <= int(port) < 32768  # below the kernel's ephemeral ports

    await cluster.preempt("g2")
    # each node reports its own replica: the attempt is over once both did
    await eventually(lambda: len(cluster.recorder.of(JobPreempted, "g2")) == 2)
    second = (Replica("n2", (0,)), Replica("n1", (0,)))  # replica 0 on n2 this time
    await cluster.job("g2", second, attempt=2)
    two = await environments(2, second)
    assert {e["MASTER_ADDR"] for e in two} == {"127.0.0.2"}
    assert len({e["MASTER_PORT"] for e in two}) == 1 and two[0]["MASTER_PORT"] != port
    assert [(e["RANK"], e["NODE_RANK"]) for e in two] == [("0", "0"), ("1", "1")]


async def test_a_taken_rendezvous_port_fails_the_attempt_clearly(cluster: Cluster) -> None:
    """Something outside Fairlane listens on the port the relay chose: replica 0's executor
    starts nothing and says which port, instead of a gang waiting for a master forever."""
    await cluster.executor("n1", gpus=2)
    gang = (Replica("n1", (0,)), Replica("n1", (1,)))
    await cluster.job("busy", gang, ("sh", "-c", "sleep 30"))
    started = await cluster.recorder.wait(JobStarted, "busy")
    placed = await cluster.recorder.wait(
        WorkRelayed, where=lambda r: any(j.job_id == "busy" and j.rendezvous for j in r.jobs)
    )
    relayed = next(j.rendezvous for j in placed.jobs if j.rendezvous is not None)
    await cluster.preempt("busy")
    await cluster.recorder.wait(JobPreempted, "busy")
    # the next attempt's port is the first free one after the first attempt's
    port = rendezvous_port("busy", 2, {relayed.port})
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        await cluster.job("busy", gang, attempt=2)
        failed = await cluster.recorder.wait(JobFailed, "busy")
    assert started.attempt == 1 and failed.attempt == 2
    assert f"the rendezvous port {port} (MASTER_PORT) on n1 is taken" in failed.reason


async def test_a_host_port_taken_outside_fairlane_fails_the_attempt_naming_it(
    cluster: Cluster,
) -> None:
    """`--port HOST:CONTAINER` where a program the cluster does not know listens on HOST: the
    executor starts nothing and the attempt's failure names the port and the node."""
    await cluster.executor("n1", gpus=1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        ports = (PortMapping(port, 8888),)
        await cluster.job("web", (Replica("n1", (0,)),), ("sleep", "30"), ports=ports)
        failed = await cluster.recorder.wait(JobFailed, "web")
    assert f"host port {port} (--port {port}:8888) on n1 is taken" in failed.reason


ROOT = Path(__file__).resolve().parent.parent


async def test_the_workload_runs_in_its_working_directory(cluster: Cluster) -> None:
    """`python3 examples/train.py`, relative to the job's working directory (the checkout),
    finds its file; the checkpoint folder is only in the environment; a job without one runs
    in its folder of run files; a folder that is not there fails the job, naming it."""
    ex = await cluster.executor("n1", gpus=3)
    train = (sys.executable, "examples/train.py", "--steps", "30", "--step-seconds", "0.001")
    await cluster.job("wd", (Replica("n1", (0,)),), train, working_dir=str(ROOT))
    done = await cluster.recorder.wait(JobCompleted, "wd", within=20)
    assert done.attempt == 1
    assert (ex.checkpoints_root / "wd" / "replica-0" / "train.json").exists()

    where = ("sh", "-c", 'pwd > "$FAIRLANE_CHECKPOINT_DIR/pwd"')
    await cluster.job("nowd", (Replica("n1", (1,)),), where)
    await cluster.recorder.wait(JobCompleted, "nowd")
    assert (ex.checkpoints_root / "nowd" / "replica-0" / "pwd").read_text().strip() == str(
        ex.data_dir / "runs" / "nowd"
    )

    missing = str(cluster.tmp / "not-there")
    await cluster.job("badwd", (Replica("n1", (2,)),), where, working_dir=missing)
    failed = await cluster.recorder.wait(JobFailed, "badwd")
    assert f"the working directory {missing!r} does not exist" in failed.reason
    assert failed.exit_code == 126


# -- hollow --------------------------------------------------------------------------------------


async def test_a_process_is_handed_its_ports_and_serves_on_the_nodes_port(
    cluster: Cluster,
) -> None:
    """`--port HOST:CONTAINER` for a process: it runs on the node itself, so it is told to
    listen on the host port (`FAIRLANE_PORT`), with every mapping in `FAIRLANE_PORTS`; what
    it serves there is reached at the node's address and that port."""
    await cluster.executor("n1", gpus=1)
    port, other = free_ports(2)
    serve = (
        'echo "$FAIRLANE_PORTS" > "$FAIRLANE_CHECKPOINT_DIR/ports"; '
        f'exec {sys.executable} -m http.server --bind 127.0.0.1 "$FAIRLANE_PORT"'
    )
    mappings = (PortMapping(port, 8888), PortMapping(other, 6000))
    await cluster.job("ws", (Replica("n1", (0,)),), ("sh", "-c", serve), ports=mappings)
    await cluster.recorder.wait(JobStarted, "ws")
    told = cluster.tmp / "n1" / "checkpoints" / "ws" / "replica-0" / "ports"
    await eventually(told.exists)
    assert told.read_text().strip() == f"{port}:8888,{other}:6000"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    await eventually(answers, within=15)


async def test_hollow_executors_report_without_starting_anything(cluster: Cluster) -> None:
    await cluster.group(
        [
            cluster.config("h1", hollow=True),
            cluster.config("h2", hollow=True, hollow_runtime_s=0.3),
            cluster.config("h3", hollow=True),
        ]
    )
    assert {e.node for e in cluster.recorder.of(NodeRegistered)} <= {"h1", "h2", "h3"}

    await cluster.job("forever", (Replica("h1", (0,)),))
    started = await cluster.recorder.wait(JobStarted, "forever")
    assert started.actor == "executor/h1"
    await cluster.preempt("forever")
    preempted = await cluster.recorder.wait(JobPreempted, "forever")
    assert not preempted.checkpointed

    await cluster.job("short", (Replica("h2", (0,)),))
    await cluster.recorder.wait(JobStarted, "short")
    completed = await cluster.recorder.wait(JobCompleted, "short")
    assert completed.actor == "executor/h2"

    # a gang over two nodes loses its newest replica: the node holding it reports
    await cluster.job("gang", (Replica("h1", (1,)), Replica("h3", (0,))))
    await cluster.recorder.wait(JobStarted, "gang")
    await cluster.preempt("gang", replicas=1)
    partial = await cluster.recorder.wait(JobPreempted, "gang")
    assert (partial.replicas, partial.actor) == (1, "executor/h3")

    assert not any(cluster.tmp.glob("h*/processes.json"))
    assert not any(cluster.tmp.glob("h*/runs"))


async def test_an_executor_is_delivered_only_its_own_nodes_work(cluster: Cluster) -> None:
    """Each executor's consumer filters on `fl-work.<its node>`: jobs running elsewhere cost
    it nothing, however many there are."""
    mine = await cluster.executor("h1", gpus=1, hollow=True)
    other = await cluster.executor("h2", gpus=1, hollow=True)
    await cluster.job("here", (Replica("h1", (0,)),))
    await cluster.recorder.wait(JobStarted, "here")
    for i in range(5):  # five attempts of a job over there: placed, started, preempted
        await cluster.job("there", (Replica("h2", (0,)),), attempt=i + 1)
        await cluster.recorder.wait(JobStarted, "there", of_attempt(i + 1))
        await cluster.preempt("there", attempt=i + 1)
        await cluster.recorder.wait(JobPreempted, "there", of_attempt(i + 1))

    def relayed_to(node: str) -> list[WorkRelayed]:
        return [e for e in cluster.recorder.of(WorkRelayed) if e.node == node]

    await eventually(lambda: other.delivered == len(relayed_to("h2")) >= 20)
    await eventually(lambda: mine.delivered == len(relayed_to("h1")))
    assert {job.job_id for r in relayed_to("h1") for job in r.jobs} == {"here"}
    assert mine.delivered == 2  # its placement and its start; nothing of the other node's
    assert len(cluster.recorder.events) > 10 * mine.delivered


# -- the workload's own events -------------------------------------------------------------------

TRAIN = (sys.executable, str(Path(__file__).resolve().parent.parent / "examples" / "train.py"))


def post_event(socket_path: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """What `fairlane.workload` does, with any token: (status, answer)."""
    connection = workload._UnixConnection(socket_path)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        connection.request("POST", "/v1/events", body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
        return response.status, answer
    finally:
        connection.close()


async def test_workload_events_reach_the_timeline_and_forged_ones_do_not(cluster: Cluster) -> None:
    ex = await cluster.executor("n1", gpus=2)
    train = (*TRAIN, "--steps", "100000", "--step-seconds", "0.002", "--checkpoint-every", "50")
    await cluster.job("w", (Replica("n1", (0,)),), train)
    await cluster.job("other", (Replica("n1", (1,)),), ("sh", "-c", "sleep 30"))
    progress = await cluster.recorder.wait(JobProgress, "w")
    assert (progress.actor, progress.attempt) == ("workload/w/1", 1)
    assert progress.step is not None and progress.step > 0 and "loss" in progress.metrics
    saved = await cluster.recorder.wait(JobCheckpointed, "w", lambda e: e.step is not None)
    assert saved.step == 50 and saved.size_bytes and saved.actor == "workload/w/1"

    assert ex.endpoint is not None
    socket_path = str(ex.endpoint.path)
    token = next(lr.token for lr in ex.local_replicas() if lr.job_id == "w")
    forged = {"id": "forged-1", "kind": "message", "text": "not mine"}
    status, answer = await asyncio.to_thread(post_event, socket_path, "x" * 32, forged)
    assert status == 401 and "unknown token" in answer["error"]
    bad = {"id": "bad-1", "kind": "progress", "step": -1}
    status, answer = await asyncio.to_thread(post_event, socket_path, token, bad)
    assert status == 400 and "step" in answer["error"]

    # the job's own token, after its attempt ended: stale
    await cluster.preempt("w")
    preempted = await cluster.recorder.wait(JobPreempted, "w")
    assert preempted.checkpointed  # it saved on SIGTERM and said so
    stale = {"id": "stale-1", "kind": "message", "text": "too late"}
    status, answer = await asyncio.to_thread(post_event, socket_path, token, stale)
    assert status == 409 and "attempt 1 of job w has ended" in answer["error"]
    await asyncio.sleep(0.3)
    messages = [e.id for e in cluster.recorder.of(JobMessage)]
    assert not any(i.endswith(("forged-1", "stale-1", "bad-1")) for i in messages)
    assert not cluster.recorder.of(JobProgress, "other")

    # its output is kept per attempt, readable after the attempt ended
    logs = attempt_logs(ex.data_dir, "w")
    assert [(entry.attempt, entry.replica) for entry in logs] == [(1, 0)]
    output = logs[0].path.read_text()
    assert "attempt 1: starting from step 0" in output and "stopping at step" in output


async def test_a_gang_of_the_training_example_resumes_each_replica_from_its_own_step(
    cluster: Cluster,
) -> None:
    """Four replicas of examples/train.py on one node: each saves to a checkpoint folder of
    its own (in one shared folder they race on the same files and fail), is preempted, and
    resumes from the step it saved itself."""
    ex = await cluster.executor("n1", gpus=4)
    train = (*TRAIN, "--steps", "100000", "--step-seconds", "0.002", "--checkpoint-every", "10")
    gang = tuple(Replica("n1", (i,)) for i in range(4))
    await cluster.job("g4", gang, train)
    await cluster.recorder.wait(JobStarted, "g4")
    folders = [ex.checkpoints_root / "g4" / f"replica-{i}" for i in range(4)]
    await eventually(lambda: all((f / "train.json").exists() for f in folders), within=20)
    await asyncio.sleep(0.5)  # many saves each, side by side
    await cluster.preempt("g4")
    preempted = await cluster.recorder.wait(JobPreempted, "g4", within=20)
    assert preempted.checkpointed and not preempted.killed
    assert not cluster.recorder.of(JobFailed, "g4")

    def said(attempt: int, words: str) -> dict[int, int]:
        """replica -> the step in its attempt's line starting with `words`"""
        steps = {}
        for entry in attempt_logs(ex.data_dir, "g4"):
            for line in entry.path.read_text().splitlines():
                if entry.attempt == attempt and words in line:
                    steps[entry.replica] = int(line.split(words)[1].split()[0])
        return steps

    stopped = said(1, "stopping at step ")
    assert sorted(stopped) == [0, 1, 2, 3] and all(step > 0 for step in stopped.values())
    for i, folder in enumerate(folders):
        assert read_json(folder / "train.json")["step"] == stopped[i]

    await cluster.job("g4", gang, attempt=2)
    await cluster.recorder.wait(JobStarted, "g4", lambda e: e.attempt == 2)
    await eventually(lambda: len(said(2, "resumed from step ")) == 4, within=20)
    assert said(2, "resumed from step ") == stopped
    await asyncio.sleep(0.3)
    assert not cluster.recorder.of(JobFailed, "g4")


async def test_the_pytorch_example_is_preempted_and_resumes(cluster: Cluster) -> None:
    """Runs where PyTorch is installed (it is not a dependency); on a GPU where there is one."""
    require_torch()
    ex = await cluster.executor("n1", gpus=1)
    example = str(Path(__file__).resolve().parent.parent / "examples" / "train_torch.py")
    command = (sys.executable, example, "--steps", "1000000", "--checkpoint-every", "50")
    await cluster.job("t", (Replica("n1", (0,)),), command)
    await cluster.recorder.wait(JobCheckpointed, "t", lambda e: e.step is not None, within=120)
    await cluster.preempt("t")
    preempted = await cluster.recorder.wait(JobPreempted, "t", within=30)
    assert preempted.checkpointed and not preempted.killed
    last = [e.step for e in cluster.recorder.of(JobCheckpointed, "t") if e.step is not None][-1]
    await cluster.job("t", (Replica("n1", (0,)),), attempt=2)
    said = await cluster.recorder.wait(JobMessage, "t", lambda e: e.attempt == 2, within=120)
    assert said.text.startswith(f"resumed from step {last} on ")
    later = await cluster.recorder.wait(JobProgress, "t", lambda e: e.attempt == 2, within=60)
    assert later.step is not None and later.step > (last or 0)
    assert "resumed from step" in attempt_logs(ex.data_dir, "t")[-1].path.read_text()


async def test_the_pytorch_example_trains_as_a_gang_over_two_nodes(cluster: Cluster) -> None:
    """torch.distributed over the rendezvous the executors give: two replicas on two nodes
    meet, are preempted together and resume from the same step. Both nodes declare GPU 0 of
    this machine, which NCCL refuses to give two ranks: gloo, on the GPU where there is one.
    Runs where PyTorch is installed (it is not a dependency)."""
    require_torch()
    nodes = [await cluster.executor(n, gpus=1) for n in ("n1", "n2")]
    example = str(Path(__file__).resolve().parent.parent / "examples" / "train_torch.py")
    steps = ("--steps", "1000000", "--checkpoint-every", "50")
    command = (sys.executable, example, *steps, "--backend", "gloo")
    gang = (Replica("n1", (0,)), Replica("n2", (0,)))

    def output(attempt: int) -> list[str]:
        return [
            entry.path.read_text()
            for ex in nodes
            for entry in attempt_logs(ex.data_dir, "tg")
            if entry.attempt == attempt
        ]

    await cluster.job("tg", gang, command)
    await cluster.recorder.wait(JobCheckpointed, "tg", lambda e: e.step is not None, within=120)
    met = [line for text in output(1) for line in text.splitlines() if " met at " in line]
    assert len(met) == 2 and len({line.split(" met at ")[1] for line in met}) == 1, met
    await cluster.preempt("tg")
    # each node reports its own replica once stored: the next attempt only after both
    await eventually(lambda: len(cluster.recorder.of(JobPreempted, "tg")) == 2, within=60)
    preempted = cluster.recorder.of(JobPreempted, "tg")
    assert all(e.checkpointed for e in preempted) and not cluster.recorder.of(JobFailed, "tg")
    await cluster.job("tg", gang, attempt=2)
    await eventually(lambda: sum("resumed from step" in t for t in output(2)) == 2, within=120)
    resumed = {t.split("resumed from step ")[1].split()[0] for t in output(2)}
    assert len(resumed) == 1  # both replicas stopped, saved and resumed at the same step


def test_a_replica_gets_a_burst_of_events_then_a_steady_rate() -> None:
    budget = Budget()
    assert all(budget.take("t", 0.0) for _ in range(int(BURST)))
    assert not budget.take("t", 0.0)
    assert budget.take("t", 1.0 / RATE)  # one more after a tenth of a second
    assert not budget.take("t", 1.0 / RATE)
    assert budget.take("other", 0.0)  # each replica has its own


def test_a_container_publishes_its_ports_as_docker_run_p_does() -> None:
    """On a bridge network the node's port is mapped to the container's, which the workload
    is told to listen on; on the host's network (the default) nothing can be mapped, and it is
    told the node's port."""
    launch = Launch(
        job_id="ws",
        attempt=1,
        replica=0,
        gpus=(),
        command=(),
        image="jupyter:1",
        env={"FAIRLANE_PORT": "8080", "FAIRLANE_PORTS": "8080:8888"},
        checkpoint_dir=Path("/data/checkpoints/ws"),
        run_dir=Path("/data/runs/ws"),
        ports=(PortMapping(8080, 8888),),
    )
    bridged = container_config(launch, "n1", None, ContainerHost((), "bridge"))
    assert bridged["HostConfig"]["PortBindings"] == {"8888/tcp": [{"HostPort": "8080"}]}
    assert bridged["ExposedPorts"] == {"8888/tcp": {}}
    assert "FAIRLANE_PORT=8888" in bridged["Env"]
    on_host = container_config(launch, "n1", None, ContainerHost((), "host"))
    assert "PortBindings" not in on_host["HostConfig"]
    assert "FAIRLANE_PORT=8080" in on_host["Env"]


def test_a_container_asks_for_its_gpus_by_uuid() -> None:
    launch = Launch(
        job_id="j",
        attempt=2,
        replica=0,
        gpus=(1, 3),
        command=("python3", "train.py"),
        image="trainer:1",
        env={"FAIRLANE_ATTEMPT": "2"},
        checkpoint_dir=Path("/data/checkpoints/j"),
        run_dir=Path("/data/runs/j"),
    )
    uuids = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")
    config = container_config(launch, "n1", None, ContainerHost(uuids, "host"))
    host = config["HostConfig"]
    assert host["DeviceRequests"] == [{"DeviceIDs": ["GPU-b", "GPU-d"], "Capabilities": [["gpu"]]}]
    assert host["Init"] is True and host["Binds"] == ["/data/checkpoints/j:/data/checkpoints/j"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-d"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # only its own GPUs exist in the container
    assert (config["Image"], config["Cmd"]) == ("trainer:1", ["python3", "train.py"])
    labels = config["Labels"]
    assert (labels["fairlane.job"], labels["fairlane.attempt"], labels["fairlane.node"]) == (
        "j",
        "2",
        "n1",
    )
    assert "PortBindings" not in host and "ExposedPorts" not in config
    # declared GPUs (no NVML): nothing to request, the indexes in the environment only
    declared = container_config(launch, "n1", None, ContainerHost((), "host"))
    assert "DeviceRequests" not in declared["HostConfig"]
