"""Node loss by heartbeat: the executor's heartbeats stop, the node watcher declares the node
lost, the scheduler runs its job elsewhere, and the node comes back reconciled.

Real nats-server, the real scheduler and node watcher in-process, one executor as a process
(killed with -9, so its heartbeats really stop) and one in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import (
    JobAdmitted,
    JobFailed,
    JobPreempted,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    ProjectConfigured,
    ProjectTerms,
    Replica,
)
from services.executor.runtime import load_records, proc_start_ticks
from services.nodewatch.rule import lapsed
from services.nodewatch.service import NodeWatch
from services.runtime.decider import Decider
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait
from tests.test_executor import POOL, Cluster, eventually, open_cluster

pytestmark = [pytest.mark.nats, pytest.mark.slow]
TIMEOUT_S = 2.0


@pytest.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with open_cluster(nats_server, tmp_path, watch=False) as c:  # each test runs its own
        yield c


async def admit(cluster: Cluster, job_id: str, command: tuple[str, ...]) -> None:
    """Submitted and admitted as admission would: the scheduler places it."""
    now = time.time()
    spec = JobSpec(project="a", command=command)
    await cluster.publish(
        JobSubmitted(id=f"{job_id}/submitted", time=now, actor="t", job_id=job_id, spec=spec)
    )
    await cluster.publish(
        JobAdmitted(
            id=f"{job_id}/admitted",
            time=now,
            actor="t",
            job_id=job_id,
            project="a",
            priority=50,
            preemptible=True,
            gpus=1,
            replicas=1,
            min_replicas=1,
            pools=(POOL,),
        )
    )


async def test_a_node_whose_heartbeats_stop_is_lost_and_comes_back_reconciled(
    cluster: Cluster,
) -> None:
    url = cluster.server.url
    await cluster.publish(
        ProjectConfigured(
            id="a", time=time.time(), actor="t", project="a", terms={POOL: ProjectTerms(quota=1)}
        )
    )
    logs = [JetStreamLog(await connect(url, name)) for name in ("scheduler", "nodewatch")]
    scheduler = Decider(logs[0], "scheduler", lambda e: isinstance(e, JobScheduled))
    watch = NodeWatch(logs[1], timeout_s=TIMEOUT_S)
    services = [asyncio.create_task(scheduler.run()), asyncio.create_task(watch.run())]

    data = cluster.tmp / "n1"
    argv = [sys.executable, "-m", "services.executor", "--nats", url, "--node", "n1"]
    argv += ["--pool", POOL, "--gpus", "1", "--data-dir", str(data), "--heartbeat", "0.3"]
    argv += ["--insecure-same-user"]  # pytest's folder (0700) admits no workload's own user
    output = (cluster.tmp / "n1.log").open("ab")

    def start_n1() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdout=output, stderr=output)

    n1 = start_n1()
    try:
        await cluster.recorder.wait(NodeRegistered, where=lambda e: e.node == "n1", within=20)
        await cluster.executor("n2", gpus=1, heartbeat_s=0.3)
        await admit(cluster, "j", ("sh", "-c", "sleep 60"))
        first = await cluster.recorder.wait(JobStarted, "j", within=20)
        assert first.actor == "executor/n1"  # the first registered node, on a tie
        [record] = load_records(data / "processes.json")

        n1.kill()  # kill -9: its heartbeats stop, its workload runs on
        n1.wait()
        killed = time.monotonic()
        lost = await cluster.recorder.wait(NodeLost, within=4 * TIMEOUT_S)
        assert lost.node == "n1" and time.monotonic() - killed >= TIMEOUT_S - 0.5
        assert lost.actor == watch.holder and "heartbeat" in lost.reason
        moved = await cluster.recorder.wait(JobStarted, "j", lambda e: e.attempt == 2, within=10)
        assert moved.actor == "executor/n2"
        assert proc_start_ticks(record.pid) == record.start_ticks  # still running on n1

        n1 = start_n1()  # the node comes back: it reconciles before taking work
        await eventually(lambda: len(cluster.recorder.of(NodeRegistered)) == 3, within=20)
        await eventually(lambda: proc_start_ticks(record.pid) is None, within=20)
        await asyncio.sleep(3 * TIMEOUT_S)  # it heartbeats again: not lost a second time
        assert len(cluster.recorder.of(NodeLost)) == 1
        assert not cluster.recorder.of(JobFailed, "j")
        assert not cluster.recorder.of(JobPreempted, "j")
        assert [e.attempt for e in cluster.recorder.of(JobStarted, "j")] == [1, 2]
    finally:
        n1.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            n1.wait(10)
        n1.kill()
        output.close()
        for task in services:
            await cancel_and_wait(task)
        for log in logs:
            await log.nc.close()
        with contextlib.suppress(ProcessLookupError):
            for r in load_records(data / "processes.json"):
                if r.pid and proc_start_ticks(r.pid) == r.start_ticks:
                    os.killpg(r.pid, signal.SIGKILL)


def test_a_node_is_lapsed_once_unseen_for_longer_than_the_timeout() -> None:
    seen = {"a": 10.0, "b": 7.0}
    # b unseen for exactly the timeout: not yet; c never seen at all: lapsed
    assert lapsed(["a", "b", "c"], seen, now=11.0, timeout_s=4.0) == ["c"]
    assert lapsed(["a", "b"], seen, now=11.5, timeout_s=4.0) == ["b"]


async def test_an_executor_declared_lost_stops_its_work_and_registers_again(
    cluster: Cluster,
) -> None:
    """As if cut off from the heartbeat bucket while the log still reaches it."""
    log = JetStreamLog(await connect(cluster.server.url, "nodewatch"))
    watch = asyncio.create_task(NodeWatch(log, timeout_s=TIMEOUT_S).run())
    try:
        ex = await cluster.executor("n1", gpus=1, heartbeat_s=None)
        await cluster.job("j", (Replica("n1", (0,)),), ("sh", "-c", "sleep 60"))
        await cluster.recorder.wait(JobStarted, "j")
        [record] = load_records(ex.records_path)
        lost = await cluster.recorder.wait(NodeLost, within=4 * TIMEOUT_S)
        assert lost.node == "n1"
        again = await cluster.recorder.wait(
            NodeRegistered, where=lambda e: e.id.endswith("/1"), within=10
        )
        assert again.node == "n1"
        assert proc_start_ticks(record.pid) is None  # stopped before it registered again
        assert not cluster.recorder.of(JobFailed, "j")
    finally:
        await cancel_and_wait(watch)
        await log.nc.close()
