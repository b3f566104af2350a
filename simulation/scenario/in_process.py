"""The services in one process on the in-memory log, deciding on a virtual clock.

Admission, the quota ledger, the scheduler, the preemptor, the node watcher and a node executor
per node are the services' own code (`services/`), given a `MemoryLog`, an `InProcessHost`
(commands handed to their handlers, one leader per kind, heartbeats, output and checkpoints in
memory) and a `VirtualClock` that only moves when the driver moves it, so rules that count time
(preemption_delay, min_runtime) act when a scenario's `advance` says, as they do on the core
engine. The node watcher relays each node's work to its executor, which plans and acts as on a
real node; its replicas are the scenario's (`simulation/scenario/workloads.py`): they do the
simulated work on the virtual clock and end when a step says.

A node is lost as a real one is: its executor stops (its heartbeats with it), and the node
watcher declares it lost once its heartbeat lapsed. Heartbeats lapse on a clock of their own,
moved only then, so losing a node takes none of the scenario's time.

A moment is settled when nothing in the process can run any more (`simulation/scenario/
quiet.py`): no real time is waited for, and the deciders pace themselves the same way, deciding
once the burst that woke them has landed, all of it, where on a cluster they wait a few
milliseconds for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled
from events.commands import ADMISSION_SUBJECT, LEDGER_SUBJECT, AnyCommand, Reply, service_subject
from policy.cycle import decide
from services.admission.service import Admission
from services.executor.config import ExecutorConfig
from services.executor.executor import Executor
from services.ledger.service import Ledger
from services.nodewatch.service import NodeWatch
from services.runtime.clock import VirtualClock
from services.runtime.decider import Decider
from services.runtime.eventlog import EventLog
from services.runtime.follower import Follower, OnEvent
from services.runtime.host import Host, InProcessHost
from services.runtime.memory_log import MemoryLog
from services.runtime.tasks import cancel_and_wait
from simulation.scenario.quiet import DRIVER, InlineExecutor, Quiet
from simulation.scenario.workloads import ScenarioRuntime, ScenarioWork
from simulation.spec import NodeEntry

#: The node watcher's heartbeat timeout, on the lapse clock, and the steps it is moved by:
#: a node that beats at every step is never near it.
LAPSE_TIMEOUT_S: Final = 3.0
LAPSE_STEP_S: Final = 1.0
#: How often an executor beats (real seconds: the lapse clock does not move meanwhile).
BEAT_S: Final = 0.02
#: Real seconds a node may take to register, beat or be declared lost.
NODE_LIMIT_S: Final = 10.0
#: How long a settle waits (real seconds) before it looks again, where the process is quiet
#: but something is still to happen at this moment: what only a timer on the loop's clock
#: brings (a decider's safety tick).
RETRY_S: Final = 0.005


def _places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def _preempts(e: Event) -> bool:
    return isinstance(e, JobPreemptionRequested | JobNominated)


@dataclass
class Node:
    executor: Executor
    task: asyncio.Task[None]


class InProcessError(RuntimeError):
    """The services on the in-memory log did something the scenario cannot go on from (a node
    that never registered, a service that stopped): the scenario's error, not a traceback."""


class InProcessCluster:
    """The services on one `MemoryLog` and one `VirtualClock`; `settle` waits until nothing
    more happens at the clock's present moment, `advance` moves the clock through every moment
    a service is waiting for."""

    def __init__(self, start: float = 0.0) -> None:
        self.log = MemoryLog()
        self.clock = VirtualClock(start)
        self.lapse = VirtualClock()
        self.host = InProcessHost(self.log)
        self.observer = Follower(self.log)
        self.work = ScenarioWork(self.clock)
        self.quiet = Quiet()
        self.nodes: dict[str, Node] = {}
        self.starts: dict[str, int] = {}  # executors started so far, per node
        self.tasks: list[asyncio.Task[None]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="fairlane-in-process-")

    async def start(self, on_event: OnEvent | None = None) -> None:
        """Start the services; `on_event` sees every event as the observer applies it."""
        log, clock, host, pace = self.log, self.clock, self.host, self.quiet.pace
        asyncio.get_running_loop().set_default_executor(InlineExecutor())
        self._spawn(self.quiet.run())
        self._spawn(self.observer.run(on_event))
        self._spawn(Admission(log, clock, host).run())
        self._spawn(Ledger(log, clock=clock, host=host).run())
        self._spawn(Decider(log, "scheduler", _places, clock, host=host, pace=pace).run())
        self._spawn(Decider(log, "preemptor", _preempts, clock, host=host, pace=pace).run())
        watch = NodeWatch(log, LAPSE_TIMEOUT_S, clock=clock, host=host, lapse_clock=self.lapse)
        self._spawn(watch.run())
        await self.host.until_served(ADMISSION_SUBJECT, LEDGER_SUBJECT)

    async def stop(self) -> None:
        for task in [*(n.task for n in self.nodes.values()), *self.tasks]:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await self.work.close()
        self._dir.cleanup()

    # -- nodes -----------------------------------------------------------------------------------

    async def add_node(self, name: str, pool: str, gpus: int) -> None:
        """A node executor (the real one, on this host and clock) for `name`, registered."""
        entry = NodeEntry(name=name, pool=pool, gpus=gpus)
        data_dir = Path(self._dir.name) / name
        start = self.starts[name] = self.starts.get(name, 0) + 1
        executor = scenario_executor(self.log, self.work, entry, data_dir, start, self.host)
        ready = asyncio.Event()
        self.nodes[name] = Node(executor, asyncio.create_task(executor.run(ready)))
        async with asyncio.timeout(NODE_LIMIT_S):
            await ready.wait()
        await self.settle()
        if name not in self.observer.state.nodes:
            raise InProcessError(f"node {name} did not register")

    async def lose(self, name: str) -> None:
        """The node goes away: its executor stops, its heartbeat lapses, the node watcher
        declares it lost."""
        node = self.nodes.pop(name, None)
        if node is None or name not in self.observer.state.nodes:
            return
        await cancel_and_wait(node.task)
        beats = self.host.heartbeats()
        async with asyncio.timeout(NODE_LIMIT_S):
            while name in self.observer.state.nodes:
                before = {n: await beats.get(n) for n in self.nodes}
                self.lapse.advance(LAPSE_STEP_S)
                for other, revision in before.items():  # every other node beats again
                    while await beats.get(other) == revision:  # noqa: ASYNC110 (polled)
                        await asyncio.sleep(BEAT_S / 2)
                await self.settle()

    def finish(self, job_id: str, ok: bool) -> None:
        """The job's workload exits 0 or 1: its executors report it."""
        self.work.finish(job_id, 0 if ok else 1)

    def _spawn(self, body: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(body))

    async def command(self, command: AnyCommand) -> Reply:
        reply = await self.host.send(service_subject(command), command)
        await self.settle()
        return reply

    async def settle(self, limit_s: float = 30.0) -> None:
        """Until nothing in the process can run, no start or stop is outstanding and the
        policy has nothing more to decide at this moment. A service that stopped is an error,
        not a wait."""
        async with asyncio.timeout(limit_s):
            while True:
                await self.quiet.until_quiet(DRIVER)
                self._raise_if_one_stopped()
                due = self.clock.next_due()
                if due is not None and due <= self.clock.now():
                    self.clock.move_to(self.clock.now())  # wake who slept until now
                    continue
                if self.observer.applied_seq < await self.log.last_seq() or self._outstanding():
                    await asyncio.sleep(RETRY_S)
                    continue
                return

    def _raise_if_one_stopped(self) -> None:
        for task in self.tasks:
            if task.done():
                raise InProcessError(f"a service stopped: {task.exception() or 'it returned'}")

    def _outstanding(self) -> bool:
        state = self.observer.state
        if any(j.phase == "starting" or j.stop_replicas for j in state.live.values()):
            return True
        if not all(settled_executor(n.executor) for n in self.nodes.values()):
            return True
        return bool(decide(state, self.clock.now()))

    async def advance(self, seconds: float) -> None:
        """Move the clock on, stopping at each moment a service sleeps until, and settling."""
        end = self.clock.now() + seconds
        await self.settle()
        while (due := self.clock.next_due()) is not None and due <= end:
            self.clock.move_to(due)
            await self.settle()
        self.clock.move_to(end)
        await self.settle()


def scenario_executor(  # noqa: PLR0913 (the node, its start, and where it runs)
    log: EventLog,
    work: ScenarioWork,
    node: NodeEntry,
    data_dir: Path,
    start: int,
    host: Host | None = None,
) -> Executor:
    """The real node executor for a scenario's node: its replicas do the scenario's `work` on
    the work's virtual clock, which the executor runs on too; it beats every BEAT_S (real
    seconds). `start` counts the node's executors (from 1): a node that comes back after it
    was lost is a new start, as a real node's new process is, and registers under an id of
    its own (under the first's, the stream dropped it as a repeat, and it never joined)."""
    config = ExecutorConfig(
        node=node.name,
        pool=node.pool,
        gpus=node.gpus,
        data_dir=data_dir,
        heartbeat_s=BEAT_S,
        gpu_sample_s=None,
        checkpoint_poll_s=3600.0,  # its runtime has it look at each save as it is made
        boot_id=f"scenario-{start}",
    )
    runtime = ScenarioRuntime(work)
    executor = Executor(log, config, runtime, work.clock, host)
    runtime.look = executor.actuator.look_all
    return executor


def settled_executor(executor: Executor) -> bool:
    """No store and no report of the executor's in flight."""
    act = executor.actuator
    storing = any(r.storing for r in act.replicas.values())
    return not storing and not (act.reported - act.published - act.failed)
