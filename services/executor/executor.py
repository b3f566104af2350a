"""One node's executor: a loop that folds, plans, then acts.

Its node's relayed work is folded into a `NodeWork` (by `ExecutorGroup`); what runs here is
kept as facts by the `Actuator`. After every relay and every observation the loop asks the
pure planner (`plan.plan`) what to do given both and the clock's time, and hands the actions to
the actuator, which starts, signals, stores, publishes and forgets, and reports back what
happened as new facts. After a restart the actuator takes up what its earlier self left (the
workloads found, the shut down's file) and the same planner does the rest. Every id it
publishes comes from `events.ids`, so an executor that restarts and reports the same thing
again is deduplicated by the stream.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

import structlog

from events import NodeLost, NodeRegistered, WorkRelayed, ids
from services.executor.actuator import Actuator
from services.executor.config import ExecutorConfig
from services.executor.docker import DockerRuntime
from services.executor.endpoint import Endpoint, endpoint_dir
from services.executor.facts import AttemptFacts, AttemptKey
from services.executor.group import ExecutorGroup
from services.executor.inventory import Handle, checkpoints_root
from services.executor.nodework import NodeWork
from services.executor.plan import KILL_WAIT_S, SHUTDOWN_REPORT_WITHIN_S, plan
from services.executor.runtime import HollowRuntime, ProcessRuntime, Runtime
from services.executor.sampling import UsageTracker, sample_gpus
from services.runtime.clock import WALL_CLOCK, Clock
from services.runtime.eventlog import EventLog
from services.runtime.host import Host, nats_host
from services.runtime.tasks import cancel_and_wait

logger = structlog.get_logger("fairlane.executor")

#: Plans in a row after one change: every action is recorded as it is taken, so the second
#: plan is empty; more means an action that records nothing, which must not spin.
MAX_ROUNDS: Final = 8
SETTLE_POLL_S: Final = 0.05


def runtime_for(config: ExecutorConfig) -> Runtime:
    if config.hollow:
        return HollowRuntime(config.hollow_runtime_s)
    if config.runtime == "docker":
        return DockerRuntime(
            config.docker_host,
            gpu_uuids=config.gpu_uuids,
            network=config.docker_network,
            mounts=(endpoint_dir(config.data_dir.resolve()),),
            same_user=config.same_user,
        )
    return ProcessRuntime(same_user=config.same_user)


class Executor:
    """One node's executor. `run()` replays, reconciles, registers and follows the log until
    `stop()` (or cancelled), on an already connected `EventLog`, so many (hollow) executors
    can share a process and a connection (`ExecutorGroup`). Everything else (heartbeats, GPU
    samples, the workloads' output, the checkpoint store) it reaches through its `host`: NATS
    by default, or `InProcessHost` beside the other services in one process."""

    def __init__(
        self,
        log: EventLog,
        config: ExecutorConfig,
        runtime: Runtime | None = None,
        clock: Clock = WALL_CLOCK,
        host: Host | None = None,
    ):
        self.log, self.config, self.clock = log, config, clock
        self.host = host or nats_host(log)
        if self.host.log is not log:
            raise ValueError("the executor's host must be on the executor's log")
        self.node = config.node
        #: Absolute: records and the workloads' environment must not depend on the cwd.
        self.data_dir = config.data_dir.resolve()
        self.runtime = runtime or runtime_for(config)
        #: Each attempt's GPU utilization here, from the samples (services/executor/sampling.py)
        self.gpu_usage = UsageTracker(config.idle_after_s)
        self.checkpoints_root = checkpoints_root(config, self.data_dir)
        self.actuator = Actuator(self.host, config, self.runtime, clock, self.gpu_usage)
        self.endpoint: Endpoint | None = None
        self._work: NodeWork | None = None
        self._loop: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._group: ExecutorGroup | None = None
        self.logger = logger.bind(node=config.node)

    # -- the public surface --------------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until `stop()` (or cancelled); `ready` is set once the log is replayed and
        what runs here is reconciled with it."""
        self._group = ExecutorGroup(self.log, [self])
        await self._group.run(ready)

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()

    @property
    def delivered(self) -> int:
        """Messages the log delivered to this executor (its node's relayed work only)."""
        return self._group.delivered if self._group is not None else 0

    @property
    def work(self) -> NodeWork:
        """This node's work as relayed to it (replayed before `reconcile`)."""
        if self._work is None:
            raise RuntimeError("the executor has not replayed its work yet")
        return self._work

    @property
    def records_path(self) -> Path:
        return self.data_dir / "processes.json"

    @property
    def attempts(self) -> dict[AttemptKey, AttemptFacts]:
        """The attempts with a replica here."""
        return self.actuator.attempts

    def local_replicas(self) -> list[Handle]:
        return list(self.actuator.handles.values())

    def registration(self) -> NodeRegistered:
        """This node as it offers itself (the first time this executor runs)."""
        return NodeRegistered(
            id=ids.node_registered(self.node, self.config.boot_id),
            time=self.clock.now(),
            actor=self.config.actor,
            node=self.node,
            pool=self.config.pool,
            gpus=self.config.gpus,
            gpu_uuids=self.config.gpu_uuids,
            gpu_source=self.config.gpu_source,
            gpu_devices=self.config.gpu_devices,
            address=self.config.address,
        )

    # -- start-up and the live tail --------------------------------------------------------------

    async def register(self) -> None:
        event = self.registration()
        await self.actuator.publish(event)
        self.logger.info(
            "node registered", pool=self.config.pool, gpus=self.config.gpus, id=event.id
        )

    def relays(self) -> EventLog:
        """Where this node's work is relayed: the relay stream its host gives."""
        return self.host.relays()

    async def heartbeat(self) -> None:
        """Put this node's heartbeat every `heartbeat_s`, until cancelled."""
        every = self.config.heartbeat_s
        if every is None or self.config.hollow:
            return
        beats = self.host.heartbeats()
        while True:
            try:
                await beats.put(self.node)
            except Exception as e:  # the server away, the bucket being made: next time
                self.logger.warning("heartbeat not sent", error=str(e) or repr(e))
            await asyncio.sleep(every)

    async def sample(self) -> None:
        """The GPUs' samples, until cancelled (see `sampling`)."""
        act = self.actuator
        await sample_gpus(
            self.config,
            self.host.gpu_samples(),
            self.gpu_usage,
            act.held_gpus,
            lambda: set(act.attempts),
        )

    async def reconcile(self, work: NodeWork) -> None:
        """After the replay: take up what runs here, then plan and act on every change."""
        self._work = work
        found = await self.runtime.found(self.records_path, self.node) if self.runtime.real else []
        if self.runtime.real and self.endpoint is None:
            self.endpoint = Endpoint(self.actuator, work)
            self.actuator.endpoint_path = self.endpoint.path
            await self.endpoint.start()
        self.actuator.take_up(work, [r for r in found if r.node == self.node])
        self.step()
        if self._loop is None:
            self._loop = asyncio.create_task(self._follow_changes())
        if self.runtime.saves and self._poller is None:
            self._poller = asyncio.create_task(self._poll())

    def on_event(self, relay: WorkRelayed) -> None:
        """One live relay to this node; `self.work` already includes it."""
        event = relay.event
        if isinstance(event, NodeLost) and event.node == self.node:
            self.logger.warning("this node was declared lost: stopping everything here")
            self.actuator.lost = True
        job_id = getattr(event, "job_id", None)
        if not isinstance(job_id, str) or self.actuator.lost:
            self.actuator.inventory.touch(None)  # the node's own news
            return
        for job in relay.jobs:
            self.actuator.inventory.touch(job.job_id)
        self.actuator.inventory.touch(job_id)

    def step(self) -> None:
        """Plan, then act, until the plan asks for nothing more: the jobs touched since the
        last step, and those the actions touch in turn (everything after news of the node's
        own; see `Inventory.touch`)."""
        offer = self.registration()
        inventory = self.actuator.inventory
        jobs = inventory.take_touched()
        for _ in range(MAX_ROUNDS):
            actions = plan(self.work, self.actuator.here(offer), self.clock.now(), jobs)
            if not actions:
                self.actuator.forget_reports(self.work, jobs)
                return
            self.actuator.act(actions)
            more = inventory.take_touched()
            jobs = None if jobs is None or more is None else {*jobs, *more}
        self.logger.error("the plan did not settle", actions=[type(a).__name__ for a in actions])

    async def _follow_changes(self) -> None:
        changed = self.actuator.changed
        while True:
            await changed.wait()
            changed.clear()
            try:
                self.step()
            except Exception:
                self.logger.exception("executor failed to plan or act")

    async def _poll(self) -> None:
        """Checkpoint markers and folders, every `checkpoint_poll_s`."""
        while True:
            await asyncio.sleep(self.config.checkpoint_poll_s)
            try:
                self.actuator.look_all()
            except Exception:
                self.logger.exception("checkpoint poll failed")

    # -- closing ---------------------------------------------------------------------------------

    async def close(self, stop_workloads: bool | None = None) -> None:
        """Stop watching. Workloads keep running (a restarted executor adopts them) unless
        `stop_workloads` (default: the config's `stop_workloads_on_exit`); with the config's
        `shutdown_on_exit`, they are stopped as a preemption does and reported stopped for a
        shut down first (see `shutdown`)."""
        if stop_workloads is None:
            stop_workloads = self.config.stop_workloads_on_exit
        if self._poller is not None:
            await cancel_and_wait(self._poller)
            self._poller = None
        if self._work is not None and self._loop is not None:
            if self.config.shutdown_on_exit:
                self.actuator.shut_down(self._work)
                await self._settle()
                stop_workloads = True  # and whatever else still runs here, without a report
            if stop_workloads:
                self.actuator.closing = "stop"
                self.actuator.inventory.touch(None)
                await self._settle()
            await cancel_and_wait(self._loop)
            self._loop = None
        await asyncio.gather(*(cancel_and_wait(task) for task in list(self.actuator.tasks)))
        if self.endpoint is not None:
            await self.endpoint.close()
        await self.runtime.close()

    async def _settle(self) -> None:
        """Until nothing here runs and nothing is in flight, or as long as the longest grace
        period, SIGKILL's wait and a report's tries take."""
        graces = [self.work.grace_of(r.job_id) for r in self.actuator.replicas.values()]
        within = max(graces, default=0.0) + KILL_WAIT_S + SHUTDOWN_REPORT_WITHIN_S + 5.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        # busy() is a fact of many kinds (replicas, stores, reports): looked at, not awaited
        while self.actuator.busy() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(SETTLE_POLL_S)
