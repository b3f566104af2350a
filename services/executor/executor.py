"""One node's executor: what runs here, and the log events that concern it.

It takes up what its earlier self left (`reconcile`), registers the node, then reacts to each
live event relayed to its node with its node's work as it is right after that event
(`on_event`): starts replicas
(`lifecycle`), stops them (`stopping`) and reports checkpoints (`checkpoints`). Every id it
publishes is derived from the job, the attempt and what happened, so an executor that restarts
and reports the same thing again is deduplicated by the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from hmac import compare_digest
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import structlog

from events import (
    NODE_REPORTS,
    Event,
    JobPreemptionRequested,
    JobScheduled,
    NodeLost,
    NodeRegistered,
)
from events.model import Replica
from services.executor.checkpoints import poll_checkpoints
from services.executor.config import ExecutorConfig
from services.executor.docker import DockerRuntime
from services.executor.endpoint import Endpoint, endpoint_dir
from services.executor.lifecycle import on_scheduled
from services.executor.local import AttemptKey, LocalAttempt, LocalReplica, marker_mtime
from services.executor.nodework import DEFAULT_GRACE_S, NodeWork
from services.executor.reconcile import reconcile
from services.executor.runtime import (
    HollowRuntime,
    ProcessRuntime,
    Runtime,
    checkpoint_dir,
    save_records,
)
from services.executor.sampling import UsageTracker
from services.executor.shutdown import shut_down
from services.executor.stopping import begin_stop, grace_of, sync_job, terminate, wait_all
from services.executor.storage import ObjectCheckpoints
from services.runtime.eventlog import JetStreamLog
from services.runtime.heartbeats import heartbeat_bucket
from services.runtime.tasks import cancel_and_wait

if TYPE_CHECKING:
    from services.executor.group import ExecutorGroup

logger = structlog.get_logger("fairlane.executor")


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
    can share a process and a connection (`ExecutorGroup`)."""

    def __init__(self, log: JetStreamLog, config: ExecutorConfig, runtime: Runtime | None = None):
        self.log = log
        self.config = config
        self.node = config.node
        #: Absolute: records and the workloads' environment must not depend on the cwd.
        self.data_dir = config.data_dir.resolve()
        self.runtime = runtime or runtime_for(config)
        storage = config.checkpoint_storage
        #: Where the replicas' checkpoint folders are (`<job>/replica-<i>` under it): this
        #: node's data folder, or the folder every node shares.
        self.checkpoints_root = (
            storage.path.resolve()
            if storage.kind == "shared_fs" and storage.path is not None
            else self.data_dir / "checkpoints"
        )
        #: The cluster's checkpoint store (None: a shared folder, or nothing runs for real).
        self.objects = (
            ObjectCheckpoints(log.js, storage.max_bytes)
            if storage.kind == "object_store" and self.runtime.real
            else None
        )
        self.attempts: dict[AttemptKey, LocalAttempt] = {}
        #: Where workloads publish their own events (real runtimes only).
        self.endpoint = Endpoint(self) if self.runtime.real else None
        self._work: NodeWork | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._group: ExecutorGroup | None = None
        self.registrations = 0  # how often this run registered again after being lost
        #: Each attempt's GPU utilization here, from the samples (services/executor/sampling.py)
        self.gpu_usage = UsageTracker(config.idle_after_s)
        self.logger = logger.bind(node=config.node)

    # -- the public surface --------------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until `stop()` (or cancelled); `ready` is set once the log is replayed and
        what runs here is reconciled with it."""
        from services.executor.group import ExecutorGroup  # noqa: PLC0415  (it drives this)

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

    def registration(self) -> NodeRegistered:
        again = f"/{self.registrations}" if self.registrations else ""
        return NodeRegistered(
            id=f"{self.node}/registered/{self.config.boot_id}{again}",
            time=time.time(),
            actor=self.config.actor,
            node=self.node,
            pool=self.config.pool,
            gpus=self.config.gpus,
            gpu_uuids=self.config.gpu_uuids,
            gpu_source=self.config.gpu_source,
            gpu_devices=self.config.gpu_devices,
            address=self.config.address,
        )

    def attempt_utilization(self, job_id: str, attempt: int) -> float | None:
        """The mean utilization of the attempt's GPUs here over its samples (None: unknown),
        for the event that ends the attempt."""
        return self.gpu_usage.average((job_id, attempt))

    def local_replicas(self) -> list[LocalReplica]:
        return [lr for att in self.attempts.values() for lr in att.replicas.values()]

    def replica_with_token(self, token: str) -> LocalReplica | None:
        return next(
            (lr for lr in self.local_replicas() if lr.token and compare_digest(lr.token, token)),
            None,
        )

    # -- start-up and the live tail --------------------------------------------------------------

    async def register(self) -> None:
        event = self.registration()
        await self.publish(event)
        self.logger.info(
            "node registered", pool=self.config.pool, gpus=self.config.gpus, id=event.id
        )

    async def heartbeat(self) -> None:
        """Put this node's key in the heartbeat bucket every `heartbeat_s`, until cancelled."""
        every = self.config.heartbeat_s
        if every is None or self.config.hollow:
            return
        bucket = None
        beat = msgspec.json.encode({"boot": self.config.boot_id})
        while True:
            try:
                bucket = bucket or await heartbeat_bucket(self.log.js)
                await bucket.put(self.node, beat)
            except Exception as e:  # the server away, the bucket being made: next time
                self.logger.warning("heartbeat not sent", error=str(e) or repr(e))
            await asyncio.sleep(every)

    async def _register_again(self) -> None:
        """Once what ran here is stopped, offer the node again: it comes back empty."""
        await wait_all((lr.finished for lr in self.local_replicas()), None)
        self.registrations += 1
        await self.register()

    async def reconcile(self, work: NodeWork) -> None:
        """After the replay: take up what runs here (see `reconcile`), then poll checkpoints."""
        self._work = work
        found = await self.runtime.found(self.records_path, self.node) if self.runtime.real else []
        if self.endpoint is not None:
            await self.endpoint.start()
        reconcile(self, found)
        if self.runtime.real and self._poller is None:
            self._poller = asyncio.create_task(poll_checkpoints(self))

    def on_event(self, event: Event) -> None:
        """React to one live event relayed here; `self.work` already includes it. Never blocks:
        anything that waits runs in a task of its own."""
        match event:
            case JobScheduled():
                on_scheduled(self, event)
            case JobPreemptionRequested():
                job = self.work.jobs.get(event.job_id)
                if job is not None and job.attempt == event.attempt and job.stop_replicas > 0:
                    begin_stop(self, job, event)
            case NodeLost(node=node) if node == self.node:
                self.logger.warning("this node was declared lost: stopping everything here")
                for held in {key[0] for key in self.attempts}:
                    sync_job(self, held)
                self.spawn(self._register_again())
                return
        job_id = getattr(event, "job_id", None)
        if isinstance(job_id, str):
            sync_job(self, job_id)

    # -- the attempts and replicas here ----------------------------------------------------------

    def attempt(
        self, job_id: str, attempt: int, scheduled_id: str | None, announce: bool, first: int
    ) -> LocalAttempt:
        """The local attempt, made on first use (`announce`: this executor reports its start;
        `first`: the lowest index of the job's replicas here, whose checkpoint marker says
        whether the attempt checkpointed; replica 0's where it runs here)."""
        key = (job_id, attempt)
        att = self.attempts.get(key)
        if att is None:
            directory = checkpoint_dir(self.checkpoints_root, job_id, first)
            att = LocalAttempt(
                job_id=job_id,
                attempt=attempt,
                checkpoint_dir=directory,
                baseline_mtime=marker_mtime(directory) if self.runtime.real else None,
                scheduled_id=scheduled_id,
            )
            if not announce:
                att.started.set()
            self.attempts[key] = att
        return att

    def add(self, att: LocalAttempt, index: int, replica: Replica) -> LocalReplica:
        lr = LocalReplica(job_id=att.job_id, attempt=att.attempt, index=index, replica=replica)
        att.replicas[replica] = lr
        return lr

    def drop(self, lr: LocalReplica) -> None:
        att = self.attempts.get(lr.key)
        if att is None or att.replicas.get(lr.replica) is not lr:
            return
        del att.replicas[lr.replica]
        if lr.workload is not None and lr.ended:
            lr.workload.discard()
        if self.endpoint is not None:
            self.endpoint.forget(lr.token, lr.key)
        if not att.replicas:
            del self.attempts[lr.key]
        self.save_records()

    def save_records(self) -> None:
        if not self.runtime.real:
            return
        records = [
            lr.workload.record
            for lr in self.local_replicas()
            if lr.workload is not None and lr.workload.record is not None
        ]
        save_records(self.records_path, records)

    def _grace(self, job_id: str) -> float:
        return grace_of(self, job_id) if self._work is not None else DEFAULT_GRACE_S

    # -- plumbing --------------------------------------------------------------------------------

    async def publish(self, event: Event, give_up_after: float = 300.0) -> None:
        """Publish until stored: ids are deterministic, so a retry is never a duplicate. A
        report of an attempt here names this node: the server takes one only on this node's
        subject, and the fold only from a node the attempt has a replica on."""
        if isinstance(event, NODE_REPORTS) and event.node is None:
            event = msgspec.structs.replace(event, node=self.node)
        await self.log.publish_durably(event, give_up_after=give_up_after)

    def spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("executor task failed", exc_info=task.exception())

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
        if self.config.shutdown_on_exit:
            await shut_down(self)
            stop_workloads = True  # and whatever else still runs here, without a report
        if stop_workloads:
            running = [lr for lr in self.local_replicas() if not lr.ended]
            for lr in running:
                lr.stopping = True
            grace = max((self._grace(lr.job_id) for lr in running), default=0.0)
            await terminate(running, grace)
        await asyncio.gather(*(cancel_and_wait(task) for task in list(self._tasks)))
        if self.endpoint is not None:
            await self.endpoint.close()
        await self.runtime.close()
