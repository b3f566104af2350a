"""`--engine live`: a scenario on the real services over a fresh nats-server.

Admission, the quota ledger, the scheduler, the preemptor and the node watcher (which relays
each executor's work to it) run as they do in their processes (here as tasks, each with its
own NATS connection). Steps become the commands a user would send. After each step the engine
waits until the cluster is settled: the log has been quiet for a moment, the policy has nothing
more to decide, and no start or stop is outstanding.

The clock is the scenario's to choose:

- A scenario that neither moves time nor simulates work runs on the wall clock, and every node
  gets a real node executor with its declared GPUs (process runtime, the built-in workload);
  `complete` and `fail` tell the built-in workload to exit 0 or 1.
- A scenario that does (`advance`, `duration`, `checkpoint`: `Scenario.needs_virtual_clock`)
  runs on a `VirtualClock` given to admission, the ledger, the deciders and the node watcher
  (every event in the log carries its time), which the engine moves on `advance`, settling
  at every moment something becomes due on the way (a rule's moment, a job's work finishing
  or checkpointing), as the core and in-process engines do.
  Its nodes are real node executors on the same clock, whose replicas are the in-process
  engine's (`simulation/scenario/workloads.py`): a process progresses, checkpoints and reports
  on the wall clock, so two hours of `duration` could not pass in the moment an `advance`
  takes; these do the scenario's simulated work on the virtual clock, and the executors plan,
  store checkpoints in the cluster's object store and report as they do for processes.
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

from cluster.servers import NatsServer
from events import (
    Event,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    NodeLost,
    ids,
)
from events.commands import (
    AnyCommand,
    CancelJob,
    HoldScheduling,
    SetPool,
    SubmitJob,
)
from policy.cycle import decide, next_wakeup
from services.admission.service import Admission
from services.executor.executor import Executor
from services.ledger.service import Ledger
from services.nodewatch.service import NodeWatch
from services.runtime.client import send
from services.runtime.clock import WALL_CLOCK, Clock, VirtualClock
from services.runtime.decider import Decider
from services.runtime.eventlog import JetStreamLog, Stored, connect
from services.runtime.follower import Follower
from services.runtime.tasks import cancel_and_wait
from simulation.scenario.core_engine import unsettled_on_a_copy
from simulation.scenario.in_process import scenario_executor, settled_executor
from simulation.scenario.observe import Observation, holdings, observe, what_changed
from simulation.scenario.setup import JOB_COMMANDS, Projects, node_command, pool_commands
from simulation.scenario.workloads import COMPLETE, FAIL, ScenarioWork
from simulation.spec import NodeEntry, ProjectEntry, Scenario, Step, compute_pool_of

#: Starts a node executor for (log, node, pool, gpus, data_dir); returns its running task.
ExecutorFactory = Callable[[JetStreamLog, str, str, int, Path], Awaitable[asyncio.Task[None]]]

QUIET_S = 0.3
SETTLE_LIMIT_S = 60.0
STABLE_WATCH_S = 2.5


class LiveError(RuntimeError):
    """The live cluster did not do what a step asked (a command refused, never settled)."""


#: A heartbeat timeout no scenario reaches, on either clock (simulated nodes send no heartbeat,
#: and a scenario's `advance` may pass days)
NEVER_LAPSES_S = 365 * 86_400.0


def _places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def _preempts(e: Event) -> bool:
    return isinstance(e, JobPreemptionRequested | JobNominated)


class LiveEngine:
    def __init__(self, scenario: Scenario, start_executor: ExecutorFactory | None = None) -> None:
        self.scenario = scenario
        self.start_executor = start_executor or start_process_executor
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
        #: The virtual clock the services decide on, when the scenario needs one (None: the
        #: wall clock and real executors).
        self.virtual = VirtualClock() if scenario.needs_virtual_clock is not None else None
        self.clock: Clock = self.virtual or WALL_CLOCK
        #: the scenario's work, done by the executors' replicas on the virtual clock
        self.work = ScenarioWork(self.virtual) if self.virtual is not None else None
        self.scenario_executors: dict[str, Executor] = {}
        self.starts: dict[str, int] = {}  # scenario executors started so far, per node

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.server.start()
        self.client = await self._log("client")
        await self.client.ensure_stream()
        self.follower = Follower(await self._log("observer"))
        self._spawn(self.follower.run(self._collect))
        clock = self.clock
        self._spawn(Admission(await self._log("admission"), clock).run())
        self._spawn(Ledger(await self._log("ledger"), clock=clock).run())
        self._spawn(Decider(await self._log("scheduler"), "scheduler", _places, clock).run())
        self._spawn(Decider(await self._log("preemptor"), "preemptor", _preempts, clock).run())
        # relays each executor's work to it; nodes are lost by the scenario, not by heartbeats
        watch = NodeWatch(await self._log("nodewatch"), timeout_s=NEVER_LAPSES_S, clock=clock)
        self._spawn(watch.run())
        await self._until_answering(CancelJob(job_id="readiness-probe"))
        cluster = self.scenario.config
        if self.work is None:
            # real workloads stop at once here: a long grace would only slow the run down
            grace = min(cluster.preemption_grace_s, 5.0)
            cluster = msgspec.structs.replace(cluster, preemption_grace_s=grace)
        await self._command(cluster)
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
                    await self._finish(job_id, ok=step.kind == "complete")
            case "cancel" | "pause" | "resume":  # a refusal changes nothing, as on core
                for job_id in step.value:
                    await self._command(JOB_COMMANDS[step.kind](job_id=job_id), refusable=True)
            case "set_project":
                await self._set_project(step.value)
            case "add_node":
                if step.value.pool not in self.pools:
                    self.pools.append(step.value.pool)
                    await self._command(SetPool(pool=step.value.pool))
                await self._add_node(step.value)
            case "remove_node":
                await self._remove_node(step.value)
            case "cordon" | "drain" | "uncordon":  # a lost node's refusal: as on core
                await self._command(node_command(step.kind, step.value), refusable=True)
            case "advance" if self.virtual is not None:
                await self._advance(self.virtual, step.value)
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
            if self.work is not None:
                self.work.submitted(job.id, job.spec)
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

    async def _command(self, command: AnyCommand, refusable: bool = False) -> None:
        """Send a command; its refusal is an error of the scenario's setup, unless it is a
        user's command on a job or an operator's on a node (`refusable`: cancelling a job
        that has ended, resuming one that runs, cordoning a node that was lost), which the
        other engines answer the same way and go on."""
        try:
            reply = await send(self.client.nc, command)
        except msgspec.ValidationError as e:  # refused before it is sent: out of bounds
            raise LiveError(f"{type(command).__name__} refused: {e}") from None
        if not reply.ok and not refusable:
            raise LiveError(f"{type(command).__name__} refused: {reply.error}")

    async def _set_project(self, entry: ProjectEntry) -> None:
        for command in self.projects.set(entry, self.pools):
            await self._command(command)

    async def _add_node(self, node: NodeEntry) -> None:
        executor_log = await self._log(f"executor-{node.name}")
        data_dir = self.root / "executors" / node.name
        if self.work is not None:
            start = self.starts[node.name] = self.starts.get(node.name, 0) + 1
            executor = scenario_executor(executor_log, self.work, node, data_dir, start)
            ready = asyncio.Event()
            self.executors[node.name] = asyncio.create_task(executor.run(ready))
            self.scenario_executors[node.name] = executor
            await asyncio.wait_for(ready.wait(), 15)
        else:
            self.executors[node.name] = await self.start_executor(
                executor_log, node.name, node.pool, node.gpus, data_dir
            )
        deadline = time.monotonic() + 15
        while node.name not in self.follower.state.nodes:
            if time.monotonic() > deadline:
                raise LiveError(f"node {node.name} did not register")
            await asyncio.sleep(0.02)

    async def _remove_node(self, name: str) -> None:
        self.scenario_executors.pop(name, None)
        task = self.executors.pop(name, None)
        if task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await self.client.publish(
            NodeLost(
                id=ids.node_lost(name, self.follower.applied_seq),
                time=self.clock.now(),
                actor="operator",
                node=name,
                reason="removed by the scenario",
            )
        )

    async def _finish(self, job_id: str, ok: bool) -> None:
        if self.work is not None:
            self.work.finish(job_id, COMPLETE if ok else FAIL)
            return
        # the built-in workload exits with the code it finds in `.exit` (services/executor)
        for checkpoints in self.root.glob("executors/*/checkpoints"):
            target = checkpoints / job_id
            target.mkdir(parents=True, exist_ok=True)
            (target / ".exit").write_text("0" if ok else "1")

    async def _advance(self, clock: VirtualClock, seconds: float) -> None:
        """Move the virtual clock on, stopping and settling at each moment something is due."""
        end = clock.now() + seconds
        await self.settle()
        while (due := self._next_due(clock)) is not None and due <= end:
            clock.move_to(max(due, clock.now()))
            await self.settle()
        clock.move_to(end)

    def _next_due(self, clock: VirtualClock) -> float | None:
        """The next moment something is due: one a service or a simulated job's work sleeps
        until (the clock holds those), or a rule's moment in the folded state, in case the
        decider has not yet gone to sleep on it (it wakes on the clock's moment, not after)."""
        times = (clock.next_due(), next_wakeup(self.follower.state, clock.now()))
        return min((t for t in times if t is not None), default=None)

    # -- settling and observing ------------------------------------------------------------------

    async def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_LIMIT_S
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            self._raise_if_one_stopped()
            if self.virtual is not None and self._wake_those_due_now(self.virtual):
                continue
            if self.follower.applied_seq != seen:
                seen, quiet_since = self.follower.applied_seq, time.monotonic()
                continue
            if time.monotonic() - quiet_since < QUIET_S:
                continue
            if not self._outstanding() and seen >= await self.client.last_seq():
                return
        raise LiveError(f"the cluster did not settle within {SETTLE_LIMIT_S:.0f}s")

    @staticmethod
    def _wake_those_due_now(clock: VirtualClock) -> bool:
        """Wake whoever went to sleep until the clock's present moment (a decider waiting for
        a rule's moment that is now, a job's work finishing now); whether anyone was."""
        due = clock.next_due()
        if due is None or due > clock.now():
            return False
        clock.move_to(clock.now())
        return True

    def _raise_if_one_stopped(self) -> None:
        for task in self.tasks:
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise LiveError(f"a service stopped: {error or 'it returned'}")

    def _outstanding(self) -> bool:
        state = self.follower.state
        for job in state.live.values():
            if job.phase == "starting" or job.stop_replicas:
                return True
        if not all(settled_executor(e) for e in self.scenario_executors.values()):
            return True
        return bool(decide(state, self.clock.now()))

    def observe(self) -> Observation:
        seen = observe(self.follower.state, self.events, self.clock.now(), self.compute_pool)
        seen.unsettled = self._unsettled_marker
        return seen

    def _unsettled_marker(self) -> str:
        return self._last_stability

    async def check_stable(self) -> None:
        """Watch the running cluster for a while: nothing may move. On the virtual clock, then
        also as the core engine judges it: an hour on, on a copy of the folded state, with no
        job finishing (the scenario's clock does not move)."""
        start, before = len(self.events), holdings(self.follower.state)
        await asyncio.sleep(STABLE_WATCH_S)
        await self.settle()
        after = holdings(self.follower.state)
        changed = what_changed(before, after, self.events[start:])
        if not changed and self.virtual is not None:
            changed = unsettled_on_a_copy(self.follower.state, self.virtual.now())
        self._last_stability = changed

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
