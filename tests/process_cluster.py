"""A cluster of real service processes for robustness tests: start, kill -9, restart.

Each service runs as `python -m services.<name> --nats URL`, as in production, so a kill is a
real crash. Helpers read the whole log back to check what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from events import (
    Event,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobScheduled,
    JobSpec,
    JobStarted,
    NodeLost,
    Replica,
)
from events.commands import AnyCommand, Reply, SubmitJob
from policy.state import ClusterState
from services.runtime.auth import Credentials
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, Stored, connect


@dataclass
class ProcessCluster:
    nats_url: str
    root: Path
    processes: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    args: dict[str, list[str]] = field(default_factory=dict)
    #: each process's own environment additions (its NATS credentials, for one)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)

    async def start(
        self, name: str, module: str, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        args = ["-m", f"services.{module}", "--nats", self.nats_url, *extra]
        self.args[name] = args
        self.envs[name] = env or {}
        await self._launch(name)

    async def _launch(self, name: str) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        log = (self.root / "logs" / f"{name}.log").open("ab")
        self.processes[name] = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.args[name],
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.envs.get(name, {})},
        )
        log.close()

    async def kill(self, name: str) -> None:
        """kill -9: no clean-up, no goodbye."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()

    async def leader(self, *names: str, within: float = 30.0) -> str:
        """Which of `names` holds its lease, read from their own logs ("lease acquired")."""
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            for name in names:
                path = self.root / "logs" / f"{name}.log"
                if path.exists() and "lease acquired" in path.read_text(errors="replace"):
                    return name
            await asyncio.sleep(0.1)
        raise AssertionError(f"none of {names} took the lease within {within} s")

    async def restart(self, name: str) -> None:
        await self._launch(name)

    async def stop_all(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        self.processes.clear()


async def open_log(
    url: str, name: str = "test", credentials: Credentials | None = None
) -> JetStreamLog:
    log = JetStreamLog(await connect(url, name, credentials=credentials))
    await log.ensure_stream()
    return log


async def node_registered(log: JetStreamLog, node: str, within: float = 30.0) -> None:
    """Until an executor has registered its node, admission refuses every job as never
    fitting: a test that starts one waits for this before it submits."""
    deadline = asyncio.get_running_loop().time() + within
    while await log.last_on(f"fl.node.{node}.node_registered") is None:
        assert asyncio.get_running_loop().time() < deadline, f"node {node!r} never registered"
        await asyncio.sleep(0.1)


async def command(log: JetStreamLog, cmd: AnyCommand, attempts: int = 40) -> Reply:
    """Send, retrying while the service that owns it is down (a restart takes a moment)."""
    for _ in range(attempts):
        try:
            reply = await send(log.nc, cmd, wait_s=2.0)
        except Exception:  # no responder yet, or a timeout while it restarts
            await asyncio.sleep(0.25)
            continue
        if not reply.retryable:
            return reply
        await asyncio.sleep(0.25)
    raise AssertionError(f"{type(cmd).__name__} got no answer")


async def submit(log: JetStreamLog, job_id: str, spec: JobSpec) -> Reply:
    """The same idempotency key on every retry: a retried submission is one job."""
    return await command(log, SubmitJob(job_id=job_id, spec=spec, idempotency_key=job_id))


async def replay(log: JetStreamLog) -> tuple[ClusterState, list[Stored]]:
    state = ClusterState()
    stored = [s async for s in log.read(1)]
    for s in stored:
        state.apply(s.event)
    return state, stored


async def wait_until_done(log: JetStreamLog, jobs: int, within: float) -> ClusterState:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        state, _ = await replay(log)
        done = sum(1 for j in state.jobs.values() if j.phase == "completed")
        if done >= jobs:
            return state
        if asyncio.get_running_loop().time() > deadline:
            phases: dict[str, int] = {}
            for j in state.jobs.values():
                phases[j.phase] = phases.get(j.phase, 0) + 1
            raise AssertionError(f"{done} of {jobs} jobs completed in time; phases: {phases}")
        await asyncio.sleep(0.5)


def audit(stored: list[Stored]) -> list[str]:
    """What the log shows went wrong: placements the fold refused (a conflicting or stale
    decision), GPUs held by two running attempts at once, attempts started twice, jobs
    completed twice. GPU holdings come from an independent ledger (`GpuLedger`): what the
    executors started and gave back, not the fold, which refuses double takes by design."""
    problems: list[str] = []
    state = ClusterState()
    ledger = GpuLedger()
    started: dict[tuple[str, int], int] = {}
    completed: dict[str, int] = {}
    for s in stored:
        e = s.event
        verdict = state.apply(e, s.seq)
        if isinstance(e, JobScheduled) and not verdict.applied:
            problems.append(f"seq {s.seq}: placement of {e.job_id} had no effect")
        problems += [f"seq {s.seq}: {p}" for p in ledger.apply(e)]
        if isinstance(e, JobStarted):
            key = (e.job_id, e.attempt)
            started[key] = started.get(key, 0) + 1
        elif isinstance(e, JobCompleted):
            completed[e.job_id] = completed.get(e.job_id, 0) + 1
    problems += [f"{k[0]} attempt {k[1]} started {n} times" for k, n in started.items() if n > 1]
    problems += [f"{j} completed {n} times" for j, n in completed.items() if n > 1]
    return problems


class GpuLedger:
    """Who runs on which GPU, from the executors' reports alone: an attempt holds the GPUs
    of its placement from `JobStarted` until it is reported preempted, completed or failed, or
    its node is lost. Two attempts on one GPU at once is a problem."""

    def __init__(self) -> None:
        self.placed: dict[tuple[str, int], list[Replica]] = {}
        self.running: dict[str, tuple[int, list[Replica]]] = {}
        self.owners: dict[tuple[str, int], str] = {}

    def apply(self, e: Event) -> list[str]:
        if isinstance(e, JobScheduled) and not e.scale_up:
            self.placed[(e.job_id, e.attempt)] = list(e.replicas)
        elif isinstance(e, JobScheduled):
            attempt, replicas = self.running.get(e.job_id, (-1, []))
            if attempt == e.attempt:
                replicas.extend(e.replicas)
                return self._take(e.job_id, list(e.replicas))
        elif isinstance(e, JobStarted):
            placement = self.placed.get((e.job_id, e.attempt))
            if placement is None:
                return [f"{e.job_id} attempt {e.attempt} started without a placement"]
            self.running[e.job_id] = (e.attempt, list(placement))
            return self._take(e.job_id, placement)
        elif isinstance(e, JobPreempted):
            self._give_back(e.job_id, e.attempt, e.replicas)
        elif isinstance(e, JobCompleted | JobFailed):
            self._give_back(e.job_id, e.attempt, 0)
        elif isinstance(e, NodeLost):
            self.owners = {k: j for k, j in self.owners.items() if k[0] != e.node}
        return []

    def _take(self, job_id: str, replicas: list[Replica]) -> list[str]:
        problems = []
        for r in replicas:
            for g in r.gpus:
                other = self.owners.setdefault((r.node, g), job_id)
                if other != job_id:
                    problems.append(f"GPU {r.node}:{g} held by {other} and {job_id}")
        return problems

    def _give_back(self, job_id: str, attempt: int, count: int) -> None:
        held_attempt, replicas = self.running.get(job_id, (-1, []))
        if held_attempt != attempt:
            return
        gone = replicas if count == 0 or count >= len(replicas) else replicas[-count:]
        for r in gone:
            for g in r.gpus:
                if self.owners.get((r.node, g)) == job_id:
                    del self.owners[(r.node, g)]
        del replicas[len(replicas) - len(gone) :]
