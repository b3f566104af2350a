"""kill -9 under load, checked against an independent ledger of GPU holdings
(simulation/holdings.py).

- Admission is killed 10 times during a storm of submissions from several clients, each of
  which retries with its idempotency key until it gets an answer: every submission ends
  admitted or rejected (none stuck), a repeat gets the first answer, and every admitted job runs.
- The preemptor is killed 3 times while project a reclaims its quota from project b.
- nats-server itself is killed with SIGKILL under load and started again on its store: nothing
  it acknowledged is lost, and the services carry on.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import (
    JobAdmitted,
    JobCompleted,
    JobPreempted,
    JobPreemptionRequested,
    JobRejected,
    JobScheduled,
    JobSpec,
    JobSubmitted,
)
from events.commands import Reply, SetPool, SetProject
from services.nodewatch.service import TIMEOUT_ENV
from simulation.holdings import check_holdings
from tests.process_cluster import (
    ProcessCluster,
    command,
    node_registered,
    open_log,
    replay,
    submit,
)

pytestmark = pytest.mark.slow
NODES = 2
GPUS = 8
#: at least this many submissions; a storm goes on until its kills are done
JOBS = 160
CLIENTS = 8


async def start_cluster(pc: ProcessCluster, tmp_path: Path) -> None:
    for name in ("admission", "ledger", "scheduler", "preemptor"):
        await pc.start(name, name)
    # relays the executors' work; hollow nodes send no heartbeats: never lost
    await pc.start("nodewatch", "nodewatch", env={TIMEOUT_ENV: "3600"})
    for i in range(NODES):
        await pc.start(
            f"executor-{i}",
            "executor",
            *("--node", f"n{i}", "--pool", "default", "--gpus", str(GPUS)),
            *("--hollow", "--hollow-runtime", "0.2", "--data-dir", str(tmp_path / f"x{i}")),
        )


async def configure(url: str) -> None:
    log = await open_log(url, "operator")
    assert (await command(log, SetPool(pool="default"))).ok
    for project in ("a", "b"):
        assert (await command(log, SetProject(project=project, pool="default", quota=8))).ok
    for i in range(NODES):
        await node_registered(log, f"n{i}")
    await log.nc.close()


def spec(i: int) -> JobSpec:
    # every seventh asks for a project that does not exist: those must be rejected, not stuck
    project = "nobody" if i % 7 == 0 else ("a" if i % 2 else "b")
    return JobSpec(project=project, gpus=1 + i % 2, priority_class="train")


async def storm(url: str, answers: dict[str, Reply], calm: asyncio.Event) -> None:
    """Submissions from CLIENTS clients, JOBS at least and on until `calm` is set (so the
    kills land during the storm, however fast this machine is)."""

    async def client(k: int) -> None:
        log = await open_log(url, f"client{k}")
        i = k
        while i < JOBS or not calm.is_set():
            answers[f"s{i}"] = await submit(log, f"s{i}", spec(i))
            i += CLIENTS
        await log.nc.close()

    await asyncio.gather(*(client(k) for k in range(CLIENTS)))


def stuck_submissions(answers: dict[str, Reply]) -> set[str]:
    """Submissions answered without a verdict (each retry carries the same idempotency key,
    so a crash between admission's two writes must still end in a verdict)."""
    return {j for j, r in answers.items() if r.event is None}


def no_stuck_submissions(stuck: set[str]) -> None:
    assert not stuck, f"{len(stuck)} submission(s) never got a verdict: {sorted(stuck)[:5]}"


async def wait_for_runs(url: str, admitted: set[str], within: float) -> None:
    log = await open_log(url, "watcher")
    deadline = asyncio.get_running_loop().time() + within
    while True:
        state, _ = await replay(log)
        done = {j for j in admitted if state.jobs[j].phase == "completed"}
        if done == admitted:
            break
        assert asyncio.get_running_loop().time() < deadline, sorted(admitted - done)[:10]
        await asyncio.sleep(0.5)
    await log.nc.close()


async def test_admission_killed_10_times_during_a_submit_storm(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    pc = ProcessCluster(nats_server.url, tmp_path)
    await start_cluster(pc, tmp_path)
    try:
        await configure(nats_server.url)
        answers: dict[str, Reply] = {}
        calm = asyncio.Event()
        storming = asyncio.create_task(storm(nats_server.url, answers, calm))
        rng = random.Random(10)
        for _ in range(10):
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            await pc.kill("admission")
            await pc.restart("admission")
        calm.set()
        await asyncio.wait_for(storming, 180)

        stuck = stuck_submissions(answers)
        admitted = {j for j, r in answers.items() if isinstance(r.event, JobAdmitted)}
        rejected = {j for j, r in answers.items() if isinstance(r.event, JobRejected)}
        assert len(admitted) + len(rejected) + len(stuck) == len(answers) >= JOBS
        assert rejected == {j for j in answers if int(j[1:]) % 7 == 0} - stuck

        log = await open_log(nats_server.url, "auditor")
        _, stored = await replay(log)
        verdicts: dict[str, int] = {}
        for s in stored:
            if isinstance(s.event, JobAdmitted | JobRejected):
                verdicts[s.event.job_id] = verdicts.get(s.event.job_id, 0) + 1
        assert verdicts == dict.fromkeys(set(answers) - stuck, 1)  # one verdict each, never two
        submitted = [s.event.job_id for s in stored if isinstance(s.event, JobSubmitted)]
        assert sorted(submitted) == sorted(answers)
        for job in sorted(set(answers) - stuck)[:20]:  # a repeat gets the first answer
            again = await submit(log, job, spec(int(job[1:])))
            assert again.event == answers[job].event
        await log.nc.close()

        await wait_for_runs(nats_server.url, admitted, within=120)
        log = await open_log(nats_server.url, "auditor")
        _, stored = await replay(log)
        holdings = check_holdings(stored)
        assert holdings.problems == []
        assert holdings.started >= len(admitted)
        await log.nc.close()
        no_stuck_submissions(stuck)
    finally:
        await pc.stop_all()


async def test_nats_server_killed_under_load(nats_server: NatsServer, tmp_path: Path) -> None:
    pc = ProcessCluster(nats_server.url, tmp_path)
    await start_cluster(pc, tmp_path)
    try:
        await configure(nats_server.url)
        answers: dict[str, Reply] = {}
        calm = asyncio.Event()
        storming = asyncio.create_task(storm(nats_server.url, answers, calm))
        while len(answers) < 20:  # noqa: ASYNC110 (under load first)
            await asyncio.sleep(0.05)
        await nats_server.stop(hard=True)  # SIGKILL: no flush, no goodbye
        await asyncio.sleep(1.0)
        await nats_server.start()
        await asyncio.sleep(1.0)
        calm.set()
        await asyncio.wait_for(storming, 240)
        admitted = {j for j, r in answers.items() if isinstance(r.event, JobAdmitted)}
        log = await open_log(nats_server.url, "auditor")
        state, stored = await replay(log)
        # nothing acknowledged is lost: every answer given is in the log
        stuck = stuck_submissions(answers)
        for job in answers:
            assert job in state.jobs, job
            if job not in stuck:
                assert state.jobs[job].phase != "submitted", job
        await log.nc.close()
        await wait_for_runs(nats_server.url, admitted, within=120)
        log = await open_log(nats_server.url, "auditor")
        _, stored = await replay(log)
        holdings = check_holdings(stored)
        assert holdings.problems == []
        assert all(p.returncode is None for p in pc.processes.values())
        await log.nc.close()
        no_stuck_submissions(stuck)
    finally:
        await pc.stop_all()


async def test_preemptor_killed_during_preemptions(nats_server: NatsServer, tmp_path: Path) -> None:
    """Project b fills the cluster over its quota; project a's jobs reclaim their quota while
    the preemptor is killed -9 three times: the preemptions happen, once each, and every job
    (the victims resumed) runs to completion."""
    pc = ProcessCluster(nats_server.url, tmp_path)
    for name in ("admission", "ledger", "scheduler", "preemptor"):
        await pc.start(name, name)
    # relays the executors' work; hollow nodes send no heartbeats: never lost
    await pc.start("nodewatch", "nodewatch", env={TIMEOUT_ENV: "3600"})
    for i in range(NODES):
        await pc.start(
            f"executor-{i}",
            "executor",
            *("--node", f"n{i}", "--pool", "default", "--gpus", str(GPUS)),
            *("--hollow", "--hollow-runtime", "6", "--data-dir", str(tmp_path / f"x{i}")),
        )
    try:
        await configure(nats_server.url)
        log = await open_log(nats_server.url, "operator")
        train = JobSpec(project="b", gpus=1, priority_class="train")
        for i in range(NODES * GPUS):
            assert (await submit(log, f"b{i}", train)).ok
        while True:  # b holds every GPU
            state, _ = await replay(log)
            if sum(j.phase == "running" for j in state.jobs.values()) == NODES * GPUS:
                break
            await asyncio.sleep(0.2)
        for i in range(8):
            spec = JobSpec(project="a", gpus=1, priority_class="train")
            assert (await submit(log, f"a{i}", spec)).ok
        for _ in range(3):
            await pc.kill("preemptor")
            await pc.restart("preemptor")
            await asyncio.sleep(1.0)
        await wait_for_runs(
            nats_server.url, {f"a{i}" for i in range(8)} | {f"b{i}" for i in range(16)}, 120
        )
        _, stored = await replay(log)
        requested = [s.event for s in stored if isinstance(s.event, JobPreemptionRequested)]
        preempted = [s.event for s in stored if isinstance(s.event, JobPreempted)]
        # a's eight GPUs were taken back from b: by preemption, or (on a slow machine) from a
        # b job that finished first
        last_a = max(i for i, s in enumerate(stored) if isinstance(s.event, JobScheduled)
                     and s.event.job_id.startswith("a"))  # fmt: skip
        finished = [s for s in stored[:last_a] if isinstance(s.event, JobCompleted)]
        assert preempted and len(preempted) + len(finished) >= 8, (len(preempted), finished)
        assert len(requested) >= len(preempted)
        assert {e.for_job for e in requested} <= {f"a{i}" for i in range(8)}
        once = {(e.job_id, e.attempt) for e in preempted}
        assert len(once) == len(preempted)  # no attempt preempted twice
        holdings = check_holdings(stored)
        assert holdings.problems == []
        await log.nc.close()
    finally:
        await pc.stop_all()


async def test_ledger_killed_during_quota_changes(nats_server: NatsServer, tmp_path: Path) -> None:
    """Quota changes keep coming while the ledger is killed -9 five times: each is answered,
    and every project ends with the terms it was last given."""
    pc = ProcessCluster(nats_server.url, tmp_path)
    await pc.start("ledger", "ledger")
    try:
        log = await open_log(nats_server.url, "operator")
        assert (await command(log, SetPool(pool="default"))).ok
        last: dict[str, int] = {}

        calm = asyncio.Event()

        async def change(k: int) -> None:
            step = 0
            while not calm.is_set():  # until the kills are done
                project, quota = f"p{k}", step * 10 + k
                step += 1
                reply = await command(log, SetProject(project=project, quota=quota, limit=quota))
                assert reply.ok, reply.error
                last[project] = quota

        async def changes() -> None:
            await asyncio.gather(*(change(k) for k in range(8)))

        changing = asyncio.create_task(changes())
        for _ in range(5):
            await asyncio.sleep(0.3)
            await pc.kill("ledger")
            await pc.restart("ledger")
        calm.set()
        await asyncio.wait_for(changing, 120)
        assert len(last) == 8
        state, _ = await replay(log)
        for project, quota in last.items():
            terms = state.projects[project].terms["default"]
            assert (terms.quota, terms.limit) == (quota, quota), project
        await log.nc.close()
    finally:
        await pc.stop_all()
