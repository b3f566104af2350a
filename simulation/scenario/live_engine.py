"""`--engine live`: a scenario on the real services over a fresh nats-server.

Admission, the quota ledger, the scheduler, the preemptor and the node watcher (which relays
each executor's work to it) run as they do in their processes (here as tasks, each with its
own NATS connection); every node of the scenario gets a node
executor with its declared GPUs (process runtime, the built-in workload). Steps become the
commands a user would send; `complete` and `fail` tell the built-in workload to exit 0 or 1.
After each step the engine waits until the cluster is settled: the log has been quiet for a
moment, the policy has nothing more to decide, and no start or stop is outstanding.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import nats.errors

from events import (
    Event,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    NodeLost,
)
from events.commands import (
    CancelJob,
    HoldScheduling,
    SetPool,
    SubmitJob,
)
from policy.commands import ids
from policy.cycle import decide
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.nodewatch.service import NodeWatch
from services.runtime.client import send
from services.runtime.decider import Decider
from services.runtime.eventlog import JetStreamLog, Stored, connect
from services.runtime.follower import Follower
from services.runtime.servers import NatsServer
from services.runtime.tasks import cancel_and_wait
from simulation.scenario.observe import Observation, holdings, observe, what_changed
from simulation.scenario.setup import JOB_COMMANDS, Projects, pool_commands
from simulation.spec import NodeEntry, ProjectEntry, Scenario, Step, compute_pool_of

#: Starts a node executor for (log, node, pool, gpus, data_dir); returns its running task.
ExecutorFactory = Callable[[JetStreamLog, str, str, int, Path], Awaitable[asyncio.Task[None]]]

QUIET_S = 0.3
SETTLE_LIMIT_S = 60.0
STABLE_WATCH_S = 2.5


class LiveError(RuntimeError):
    """The live cluster did not do what a step asked (a command refused, never settled)."""


#: A heartbeat timeout no scenario reaches
NEVER_LAPSES_S = 86_400.0


def _places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def _preempts(e: Event) -> bool:
    return isinstance(e, JobPreemptionRequested | JobNominated)


class LiveEngine:
    def __init__(self, scenario: Scenario, start_executor: ExecutorFactory) -> None:
        self.scenario = scenario
        self.start_executor = start_executor
        self.pools = [p.name for p in scenario.pools]
        self.compute_pool = compute_pool_of(scenario)
        self.projects = Projects(self.compute_pool)
        self.events: list[Event] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.executors: dict[str, asyncio.Task[None]] = {}
        self.logs: list[JetStreamLog] = []
        self._dir = tempfile.TemporaryDirectory(prefix="fairlane-live-")
        self.root = Path(self._dir.name)
        self.server = NatsServer(store_dir=self.root / "nats")

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.server.start()
        self.client = await self._log("client")
        await self.client.ensure_stream()
        self.follower = Follower(await self._log("observer"))
        self._spawn(self.follower.run(self._collect))
        self._spawn(Admission(await self._log("admission")).run())
        self._spawn(Ledger(await self._log("ledger")).run())
        self._spawn(Decider(await self._log("scheduler"), "scheduler", _places).run())
        self._spawn(Decider(await self._log("preemptor"), "preemptor", _preempts).run())
        # relays each executor's work to it; nodes are lost by the scenario, not by heartbeats
        self._spawn(NodeWatch(await self._log("nodewatch"), timeout_s=NEVER_LAPSES_S).run())
        await self._until_answering(CancelJob(job_id="readiness-probe"))
        cluster = self.scenario.config
        # real workloads stop at once here: a long grace would only slow the run down
        grace = min(cluster.preemption_grace_s, 5.0)
        await self._command(msgspec.structs.replace(cluster, preemption_grace_s=grace))
        for pool, command in zip(self.scenario.pools, pool_commands(self.scenario), strict=True):
            await self._command(command)
            for node in pool.nodes:
                await self._add_node(node)
        for project in self.scenario.projects:
            await self._set_project(project)
        await self.settle()

    async def stop(self) -> None:
        # executors first (they stop their workloads), then the services
        for task in [*self.executors.values(), *self.tasks]:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        for log in self.logs:
            with contextlib.suppress(Exception):
                await log.nc.close()
        await self.server.stop()
        self._dir.cleanup()

    async def _log(self, name: str) -> JetStreamLog:
        log = JetStreamLog(await connect(self.server.url, name))
        self.logs.append(log)
        return log

    def _spawn(self, body: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(body))

    async def _collect(self, stored: Stored) -> None:
        self.events.append(stored.event)

    # -- steps -----------------------------------------------------------------------------------

    async def step(self, step: Step) -> None:
        match step.kind:
            case "submit":
                await self._submit(step)
            case "complete" | "fail":
                for job_id in step.value:
                    self._tell_workload(job_id, 0 if step.kind == "complete" else 1)
            case "cancel" | "pause" | "resume":
                for job_id in step.value:
                    await self._command(JOB_COMMANDS[step.kind](job_id=job_id))
            case "set_project":
                await self._set_project(step.value)
            case "add_node":
                if step.value.pool not in self.pools:
                    self.pools.append(step.value.pool)
                    await self._command(SetPool(pool=step.value.pool))
                await self._add_node(step.value)
            case "remove_node":
                await self._remove_node(step.value)
            case _:
                raise LiveError(
                    f"step {step.number}: {step.kind} is not possible on a live cluster"
                )
        await self.settle()

    async def _submit(self, step: Step) -> None:
        # "submitted in list order, before the system reacts": hold scheduling while the batch
        # lands, so the policy sees all of it at once, as the core engine does
        await self._command(HoldScheduling(held=True, reason=f"step {step.number}"))
        for job in step.value:
            await send(self.client.nc, SubmitJob(job_id=job.id, spec=job.spec))
        await self.follower.wait_for(await self.client.last_seq())
        await self._command(HoldScheduling(held=False, reason=f"step {step.number}"))

    async def _until_answering(self, probe: Any) -> None:
        """Until the service that owns `probe` answers at all (it may still be replaying)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                await send(self.client.nc, probe, wait_s=2.0)
                return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise LiveError(f"no service answers {type(probe).__name__}") from None
                await asyncio.sleep(0.05)

    async def _command(self, command: Any) -> None:
        reply = await send(self.client.nc, command)
        if not reply.ok:
            raise LiveError(f"{type(command).__name__} refused: {reply.error}")

    async def _set_project(self, entry: ProjectEntry) -> None:
        for command in self.projects.set(entry, self.pools):
            await self._command(command)

    async def _add_node(self, node: NodeEntry) -> None:
        executor_log = await self._log(f"executor-{node.name}")
        self.executors[node.name] = await self.start_executor(
            executor_log, node.name, node.pool, node.gpus, self.root / "executors" / node.name
        )
        deadline = time.monotonic() + 15
        while node.name not in self.follower.state.nodes:
            if time.monotonic() > deadline:
                raise LiveError(f"node {node.name} did not register")
            await asyncio.sleep(0.02)

    async def _remove_node(self, name: str) -> None:
        task = self.executors.pop(name, None)
        if task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await self.client.publish(
            NodeLost(
                id=ids.node_lost(name, self.follower.applied_seq),
                time=time.time(),
                actor="operator",
                node=name,
                reason="removed by the scenario",
            )
        )

    def _tell_workload(self, job_id: str, code: int) -> None:
        """The built-in workload exits with the code it finds in `.exit` (services/executor)."""
        for checkpoints in self.root.glob("executors/*/checkpoints"):
            target = checkpoints / job_id
            target.mkdir(parents=True, exist_ok=True)
            (target / ".exit").write_text(str(code))

    # -- settling and observing ------------------------------------------------------------------

    async def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_LIMIT_S
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if self.follower.applied_seq != seen:
                seen, quiet_since = self.follower.applied_seq, time.monotonic()
                continue
            if time.monotonic() - quiet_since < QUIET_S:
                continue
            if not self._outstanding():
                return
        raise LiveError(f"the cluster did not settle within {SETTLE_LIMIT_S:.0f}s")

    def _outstanding(self) -> bool:
        state = self.follower.state
        for job in state.live.values():
            if job.phase == "starting" or job.stop_replicas:
                return True
        return bool(decide(state, time.time()))

    def observe(self) -> Observation:
        seen = observe(self.follower.state, self.events, time.time(), self.compute_pool)
        seen.unsettled = self._unsettled_marker
        return seen

    def _unsettled_marker(self) -> str:
        return self._last_stability

    async def check_stable(self) -> None:
        """Watch the running cluster for a while: nothing may move."""
        start, before = len(self.events), holdings(self.follower.state)
        await asyncio.sleep(STABLE_WATCH_S)
        await self.settle()
        after = holdings(self.follower.state)
        self._last_stability = what_changed(before, after, self.events[start:])

    _last_stability = ""


async def start_process_executor(
    log: JetStreamLog, node: str, pool: str, gpus: int, data_dir: Path
) -> asyncio.Task[None]:
    """A real node executor (process runtime, built-in workload) that stops its workloads
    when the scenario ends."""
    from services.executor.service import Executor, ExecutorConfig  # noqa: PLC0415

    config = ExecutorConfig(
        node=node,
        pool=pool,
        gpus=gpus,
        data_dir=data_dir,
        stop_workloads_on_exit=True,
        checkpoint_poll_s=0.5,
    )
    ready = asyncio.Event()
    task = asyncio.create_task(Executor(log, config).run(ready))
    await asyncio.wait_for(ready.wait(), 15)
    return task
