"""The node executor: runs the replicas the log places on this node, and reports what happened.

One executor per node. It registers the node, replays the log into a `ClusterState` (the same
fold every service uses, so a placement the fold refused is refused here too), reconciles with
what its earlier self left running, then follows the live tail and reacts to each event with
the state as it is right after that event:

- `JobScheduled` for replicas on this node: start one workload per replica; the executor of the
  job's first replica reports `JobStarted`.
- `JobPreemptionRequested`: SIGTERM the replicas being taken back, SIGKILL after the grace
  period; the executor of the first of those replicas reports `JobPreempted` once its own are
  gone.
- a workload that ends by itself: any non-zero exit is `JobFailed` (reported by whichever
  executor saw it; the id is the same, so a second report is dropped); all replicas on the
  first replica's node exiting 0 is `JobCompleted`.
- `.checkpoint` in the job's checkpoint folder being touched: `JobCheckpointed` (its time is
  the marker's mtime).
- after a restart: recorded workloads still alive are adopted; those that ended meanwhile are
  reported from the exit status their shim left; one that left none (a reboot) is reported as
  `JobPreempted(reason="node_lost")`, so the job is queued again and resumes.
- anything the log says should no longer run here (the job completed or failed elsewhere, a
  preemption reported by another node, this node lost) is stopped without a report.

Every id it publishes is derived from the job, the attempt and what happened, so an executor
that restarts and reports the same thing again is deduplicated by the stream.

In-process use (the live scenario engine, benchmarks):

    executor = Executor(eventlog, ExecutorConfig(node="n0", pool="default", gpus=8))
    task = asyncio.create_task(executor.run(ready))   # ready: an asyncio.Event
    ...
    executor.stop(); await task                       # or task.cancel()

    group = ExecutorGroup(eventlog, [Executor(eventlog, ExecutorConfig(..., hollow=True))
                                     for ...])        # 100 hollow nodes, one fold
    await group.run(ready)

Limitations, on purpose for now:
- It follows the whole stream (`fl.>`). DESIGN wants work for one executor on subjects it can
  filter on; the fold needs every placement to referee them, so narrowing needs either
  per-node subjects written after the referee or a trusted single writer. `ExecutorGroup`'s
  `_events` is the one place to change.
- A gang spanning nodes is coordinated only through the log: each executor stops its own
  replicas, and the reporting executor does not wait for the other nodes' replicas to be gone
  before it reports `JobPreempted` (or `JobStarted` before theirs have started).
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeAlias

import nats.errors
import structlog
from nats.js.errors import APIError

from events import (
    Event,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobStarted,
    NodeLost,
    NodeRegistered,
    Replica,
)
from policy.state import ClusterState, Job
from services.executor.runtime import (
    SIGTERM_EXIT,
    HollowRuntime,
    Launch,
    ProcessRecord,
    ProcessRuntime,
    Runtime,
    Workload,
    checkpoint_dir,
    load_records,
    safe_name,
    save_records,
)
from services.runtime.eventlog import JetStreamLog, Stored
from services.runtime.tasks import cancel_and_wait

logger = structlog.get_logger("fairlane.executor")

CANNOT_START: Final = 126  # the exit code reported for a replica that could not be started
KILL_WAIT_S: Final = 30.0  # after SIGKILL, how long to wait before reporting anyway
PUBLISH_RETRY_S: Final = 0.5
FOLLOW_RETRY_S: Final = 0.5
CHECKPOINT_MARKER: Final = ".checkpoint"

AttemptKey: TypeAlias = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    node: str
    pool: str
    gpus: int
    gpu_uuids: tuple[str, ...] = ()
    data_dir: Path = Path(".fairlane/executor")
    hollow: bool = False
    #: Hollow replicas exit 0 after this long (0: they run until stopped).
    hollow_runtime_s: float = 0.0
    checkpoint_poll_s: float = 1.0
    stop_workloads_on_exit: bool = False
    #: Names this run of the executor in its `NodeRegistered` id.
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def actor(self) -> str:
        return f"executor/{self.node}"


# -- what the executor reads from the log ------------------------------------------------------


class LogView:
    """The fold, plus the few facts about the log that `ClusterState` does not keep and an
    executor needs after a restart: the preemption request in progress per job (its id names
    the `JobPreempted` that answers it), the `JobScheduled` that started the current attempt,
    and the checkpoints already reported. One view can serve many executors (`ExecutorGroup`).
    """

    def __init__(self) -> None:
        self.state = ClusterState()
        self.last_seq = 0
        self.requests: dict[str, JobPreemptionRequested] = {}
        self.scheduled: dict[str, str] = {}
        #: job -> (attempt, JobCheckpointed events seen for it, latest of their times)
        self.checkpoints: dict[str, tuple[int, int, float]] = {}
        #: job -> nodes of the executors (sharing this view) that have replicas of it
        self.holders: dict[str, set[str]] = {}

    def apply(self, stored: Stored) -> None:
        event = stored.event
        self.state.apply(event)
        self.last_seq = stored.seq
        job_id = getattr(event, "job_id", None)
        if job_id is None:
            return
        job = self.state.jobs.get(job_id)
        if job is None:
            return
        match event:
            case JobScheduled(scale_up=False) if accepted(job, event):
                self.scheduled[job_id] = event.id
                self.requests.pop(job_id, None)
            case JobPreemptionRequested() if job.attempt == event.attempt and job.stop_replicas > 0:
                self.requests[job_id] = event
            case JobPreempted() if job.stop_replicas == 0:
                self.requests.pop(job_id, None)
            case JobCheckpointed() if event.attempt == job.attempt:
                attempt, n, last = self.checkpoints.get(job_id, (event.attempt, 0, 0.0))
                if attempt != event.attempt:
                    n, last = 0, 0.0
                self.checkpoints[job_id] = (event.attempt, n + 1, max(last, event.time))
        if job_id not in self.state.live:
            self.requests.pop(job_id, None)
            self.scheduled.pop(job_id, None)
            self.checkpoints.pop(job_id, None)

    def checkpoints_of(self, job_id: str, attempt: int) -> tuple[int, float]:
        seen = self.checkpoints.get(job_id)
        if seen is None or seen[0] != attempt:
            return 0, 0.0
        return seen[1], seen[2]


def accepted(job: Job, event: JobScheduled) -> bool:
    """Whether the fold applied this placement (it refuses one decided on a stale state)."""
    if event.attempt != job.attempt:
        return False
    if event.scale_up:
        return job.phase in ("starting", "running") and all(r in job.held for r in event.replicas)
    return job.phase == "starting" and job.held == list(event.replicas)


def desired(job: Job | None, attempt: int, replica: Replica) -> bool:
    """Whether the log says this replica of this attempt holds its GPUs (should run, or is
    still being stopped)."""
    return job is not None and job.attempt == attempt and replica in job.held


# -- what runs here ----------------------------------------------------------------------------


@dataclass(eq=False)
class LocalReplica:
    job_id: str
    attempt: int
    index: int
    replica: Replica
    workload: Workload | None = None
    exit_code: int | None = None
    ended: bool = False
    stopping: bool = False  # this executor asked it to stop: its end is not a failure
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> AttemptKey:
        return (self.job_id, self.attempt)

    def end(self, code: int | None) -> None:
        self.exit_code, self.ended = code, True
        self.launched.set()
        self.finished.set()


@dataclass(eq=False)
class LocalAttempt:
    job_id: str
    attempt: int
    checkpoint_dir: Path
    #: The checkpoint marker's mtime before this attempt started here (None: no marker).
    baseline_mtime: float | None
    #: Set once `JobStarted` is in the log, or when it is not this executor's to report:
    #: later reports about the attempt wait for it, so the timeline stays in order.
    started: asyncio.Event = field(default_factory=asyncio.Event)
    replicas: dict[Replica, LocalReplica] = field(default_factory=dict)
    checkpoints: int = 0
    last_checkpoint: float = 0.0
    scheduled_id: str | None = None


def marker_mtime(directory: Path) -> float | None:
    try:
        return (directory / CHECKPOINT_MARKER).stat().st_mtime
    except OSError:
        return None


class Executor:
    """One node's executor. `run()` registers, replays, reconciles and follows the log until
    `stop()` (or cancelled), on an already connected `JetStreamLog`, so many (hollow) executors
    can share a process and a connection; `ExecutorGroup` also shares one fold between them."""

    def __init__(self, log: JetStreamLog, config: ExecutorConfig, runtime: Runtime | None = None):
        self.log = log
        self.config = config
        self.node = config.node
        #: Absolute: records and the workloads' environment must not depend on the cwd.
        self.data_dir = config.data_dir.resolve()
        if runtime is None:
            runtime = HollowRuntime(config.hollow_runtime_s) if config.hollow else ProcessRuntime()
        self.runtime = runtime
        self.attempts: dict[AttemptKey, LocalAttempt] = {}
        self._view: LogView | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._group: ExecutorGroup | None = None
        self._log = logger.bind(node=config.node)

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
    def view(self) -> LogView:
        if self._view is None:
            raise RuntimeError("the executor has not replayed the log yet")
        return self._view

    @property
    def state(self) -> ClusterState:
        return self.view.state

    @property
    def records_path(self) -> Path:
        return self.data_dir / "processes.json"

    def registration(self) -> NodeRegistered:
        return NodeRegistered(
            id=f"{self.node}/registered/{self.config.boot_id}",
            time=time.time(),
            actor=self.config.actor,
            node=self.node,
            pool=self.config.pool,
            gpus=self.config.gpus,
            gpu_uuids=self.config.gpu_uuids,
        )

    def local_replicas(self) -> list[LocalReplica]:
        return [lr for att in self.attempts.values() for lr in att.replicas.values()]

    # -- start-up ------------------------------------------------------------------------------

    async def register(self) -> None:
        event = self.registration()
        await self._publish(event)
        self._log.info("node registered", pool=self.config.pool, gpus=self.config.gpus, id=event.id)

    async def reconcile(self, view: LogView) -> None:
        """After the replay: adopt what an earlier run of this executor left running and the
        log still wants, stop what it does not want, report what ended while nobody watched,
        and start what was placed here but never started."""
        self._view = view
        records = load_records(self.records_path) if self.runtime.real else []
        recorded: dict[tuple[str, int, Replica], ProcessRecord] = {
            (r.job_id, r.attempt, Replica(r.node, r.gpus)): r
            for r in records
            if r.node == self.node
        }
        stops: list[Job] = []
        lost: list[LocalReplica] = []
        for job in list(self.state.live.values()):
            mine = [(i, r) for i, r in enumerate(job.held) if r.node == self.node]
            if not mine:
                continue
            first = job.held[0].node == self.node
            announce = first and job.phase == "starting"
            att = self._attempt(job.id, job.attempt, self.view.scheduled.get(job.id), announce)
            for index, replica in mine:
                record = recorded.pop((job.id, job.attempt, replica), None)
                launch = self._launch(job, index, replica)
                lr = self._add(att, index, replica)
                if record is not None:
                    att.baseline_mtime = record.checkpoint_mtime
                    lr.workload = self.runtime.adopt(record)
                    self._log.info(
                        "adopted",
                        job=job.id,
                        attempt=job.attempt,
                        replica=index,
                        pid=record.pid,
                        alive=lr.workload.alive(),
                    )
                    self._spawn(self._run_replica(lr, None))
                elif (workload := self.runtime.adopt_unrecorded(launch)) is not None:
                    lr.workload = workload
                    self._spawn(self._run_replica(lr, None))
                elif job.phase == "starting":
                    self._log.info("starting what was placed while down", job=job.id)
                    self._spawn(self._run_replica(lr, launch))
                else:
                    self._log.warning(
                        "no record of a replica the log says runs here: lost",
                        job=job.id,
                        attempt=job.attempt,
                        replica=index,
                    )
                    lr.end(None)
                    lost.append(lr)
            count, last = self.view.checkpoints_of(job.id, job.attempt)
            att.checkpoints, att.last_checkpoint = count, last
            if announce:
                self._spawn(self._announce_started(att))
            if job.stop_replicas > 0:
                stops.append(job)
        # Recorded but not wanted by the log any more: stop (or forget) without a report.
        for record in recorded.values():
            att = self._attempt(record.job_id, record.attempt, None, False)
            lr = self._add(att, record.replica, Replica(record.node, record.gpus))
            lr.workload = self.runtime.adopt(record)
            self._spawn(self._run_replica(lr, None))
        for job in stops:
            request = self.view.requests.get(job.id)
            if request is not None and request.attempt == job.attempt:
                self._begin_stop(job, request)
        for lr in lost:
            self._replica_ended(lr)
        for job_id in {key[0] for key in self.attempts}:
            self._sync_job(job_id)
        self._save_records()
        if self.runtime.real and self._poller is None:
            self._poller = asyncio.create_task(self._poll_checkpoints())

    # -- the live tail ---------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """React to one live event; `self.state` already includes it. Never blocks: anything
        that waits runs in a task of its own."""
        match event:
            case JobScheduled():
                self._on_scheduled(event)
            case JobPreemptionRequested():
                job = self.state.jobs.get(event.job_id)
                if job is not None and job.attempt == event.attempt and job.stop_replicas > 0:
                    self._begin_stop(job, event)
            case NodeLost(node=node) if node == self.node:
                self._log.warning("this node was declared lost: stopping everything here")
                for held in {key[0] for key in self.attempts}:
                    self._sync_job(held)
                return
        job_id = getattr(event, "job_id", None)
        if isinstance(job_id, str):
            self._sync_job(job_id)

    def _on_scheduled(self, e: JobScheduled) -> None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not accepted(job, e):
            return
        mine = [
            (i, r)
            for i, r in enumerate(job.held)
            if r.node == self.node and r in e.replicas and job.attempt == e.attempt
        ]
        if not mine:
            return
        announce = not e.scale_up and job.held[0].node == self.node
        key = (job.id, e.attempt)
        fresh = key not in self.attempts
        att = self._attempt(job.id, e.attempt, None if e.scale_up else e.id, announce)
        started = 0
        for index, replica in mine:
            if replica in att.replicas:
                continue  # a repeated decision: already started
            lr = self._add(att, index, replica)
            self._spawn(self._run_replica(lr, self._launch(job, index, replica)))
            started += 1
        if not started:
            return
        if announce and fresh:
            self._spawn(self._announce_started(att))
        self._log.info(
            "scaling up" if e.scale_up else "starting",
            job=job.id,
            attempt=e.attempt,
            replicas=[i for i, _ in mine],
        )

    # -- replicas --------------------------------------------------------------------------------

    def _attempt(
        self, job_id: str, attempt: int, scheduled_id: str | None, announce: bool
    ) -> LocalAttempt:
        key = (job_id, attempt)
        att = self.attempts.get(key)
        if att is None:
            directory = checkpoint_dir(self.data_dir, job_id)
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
            self.view.holders.setdefault(job_id, set()).add(self.node)
        return att

    def _add(self, att: LocalAttempt, index: int, replica: Replica) -> LocalReplica:
        lr = LocalReplica(job_id=att.job_id, attempt=att.attempt, index=index, replica=replica)
        att.replicas[replica] = lr
        return lr

    def _drop(self, lr: LocalReplica) -> None:
        att = self.attempts.get(lr.key)
        if att is None or att.replicas.get(lr.replica) is not lr:
            return
        del att.replicas[lr.replica]
        if not att.replicas:
            del self.attempts[lr.key]
            if not any(key[0] == lr.job_id for key in self.attempts):
                nodes = self.view.holders.get(lr.job_id)
                if nodes is not None:
                    nodes.discard(self.node)
                    if not nodes:
                        del self.view.holders[lr.job_id]
        self._save_records()

    def _launch(self, job: Job, index: int, replica: Replica) -> Launch:
        directory = checkpoint_dir(self.data_dir, job.id)
        env = {
            "FAIRLANE_JOB_ID": job.id,
            "FAIRLANE_ATTEMPT": str(job.attempt),
            "FAIRLANE_CHECKPOINT_DIR": str(directory),
            "FAIRLANE_REPLICA": str(index),
            "FAIRLANE_NODE": self.node,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in replica.gpus),
            # NVML numbers GPUs in PCI bus order; make CUDA use the same numbering.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        if job.attempt > 1:
            env["FAIRLANE_RESUMED"] = "1"
        return Launch(
            job_id=job.id,
            attempt=job.attempt,
            replica=index,
            gpus=replica.gpus,
            command=job.spec.command,
            image=job.spec.image,
            env=env,
            checkpoint_dir=directory,
            run_dir=self.data_dir / "runs" / safe_name(job.id),
        )

    async def _run_replica(self, lr: LocalReplica, launch: Launch | None) -> None:
        """Start (or adopt) one replica, wait for it to end, then deal with its end."""
        if lr.workload is None:
            if launch is None:
                return
            if lr.stopping:  # asked to stop before it even started: do not start it
                lr.end(SIGTERM_EXIT)
                self._replica_ended(lr)
                return
            att = self.attempts.get(lr.key)
            baseline = att.baseline_mtime if att is not None else None
            try:
                lr.workload = await self.runtime.start(launch, self.node, baseline)
            except Exception:  # the node cannot start it (a full disk, ...): the attempt fails
                self._log.exception("could not start", job=lr.job_id, replica=lr.index)
                lr.end(CANNOT_START)
                self._replica_ended(lr)
                return
            self._save_records()
        lr.launched.set()
        code = await lr.workload.wait()
        lr.end(code)
        self._log.info(
            "workload ended",
            job=lr.job_id,
            attempt=lr.attempt,
            replica=lr.index,
            exit_code=code,
            stopped=lr.stopping,
        )
        self._replica_ended(lr)

    def _replica_ended(self, lr: LocalReplica) -> None:
        if lr.stopping:
            return  # the stop in progress reports it
        if not desired(self.state.jobs.get(lr.job_id), lr.attempt, lr.replica):
            self._drop(lr)  # the log has moved on: nothing to report
            return
        self._spawn(self._report_end(lr))

    async def _report_end(self, lr: LocalReplica) -> None:
        att = self.attempts.get(lr.key)
        if att is None:
            return
        await att.started.wait()
        job = self.state.jobs.get(lr.job_id)
        if job is None or lr.stopping or not desired(job, lr.attempt, lr.replica):
            return
        base = f"{lr.job_id}/{lr.attempt}"
        if lr.exit_code is None:
            # It ended while nobody watched and left no exit status (a reboot, or its group
            # was killed from outside): the attempt is lost, the job goes back to the queue.
            await self._publish(
                JobPreempted(
                    id=f"{base}/lost",
                    time=time.time(),
                    actor=self.config.actor,
                    job_id=lr.job_id,
                    attempt=lr.attempt,
                    reason="node_lost",
                    checkpointed=self._checkpointed(att),
                )
            )
        elif lr.exit_code != 0:
            await self._publish(
                JobFailed(
                    id=f"{base}/failed",
                    time=time.time(),
                    actor=self.config.actor,
                    causation=att.scheduled_id,
                    job_id=lr.job_id,
                    attempt=lr.attempt,
                    exit_code=lr.exit_code,
                    reason=f"replica {lr.index} on {self.node} exited with code {lr.exit_code}",
                )
            )
        elif job.held[0].node == self.node and all(
            r.ended and r.exit_code == 0 and not r.stopping
            for r in att.replicas.values()
            if desired(job, r.attempt, r.replica)
        ):
            await self._publish(
                JobCompleted(
                    id=f"{base}/completed",
                    time=time.time(),
                    actor=self.config.actor,
                    causation=att.scheduled_id,
                    job_id=lr.job_id,
                    attempt=lr.attempt,
                )
            )

    async def _announce_started(self, att: LocalAttempt) -> None:
        await asyncio.gather(*(lr.launched.wait() for lr in list(att.replicas.values())))
        job = self.state.jobs.get(att.job_id)
        if job is not None and job.attempt == att.attempt:
            await self._publish(
                JobStarted(
                    id=f"{att.job_id}/{att.attempt}/started",
                    time=time.time(),
                    actor=self.config.actor,
                    causation=att.scheduled_id,
                    job_id=att.job_id,
                    attempt=att.attempt,
                    resumed=att.attempt > 1,
                )
            )
        att.started.set()

    # -- stopping --------------------------------------------------------------------------------

    def _begin_stop(self, job: Job, request: JobPreemptionRequested) -> None:
        """Stop the replicas the request takes back (the whole job, or its newest
        `request.replicas`, as the fold does) that run here."""
        whole = request.replicas == 0 or request.replicas >= len(job.held)
        targets = job.held if whole else job.held[len(job.held) - request.replicas :]
        if not targets:
            return
        reporter = targets[0].node == self.node
        att = self.attempts.get((job.id, request.attempt))
        local = [att.replicas[r] for r in targets if att is not None and r in att.replicas]
        if not local and not reporter:
            return
        self._log.info(
            "stopping",
            job=job.id,
            attempt=request.attempt,
            reason=request.reason,
            replicas=[lr.index for lr in local],
            grace_s=self.state.settings.preemption_grace_s,
        )
        self._spawn(self._stop(local, request if reporter else None))

    def _stop(
        self, replicas: list[LocalReplica], request: JobPreemptionRequested | None
    ) -> Awaitable[None]:
        """Mark the replicas as being stopped (now, so that their end is not taken for a
        failure) and return the work: SIGTERM, the grace period, SIGKILL, then the report."""
        fresh = [lr for lr in replicas if not lr.stopping]
        for lr in replicas:
            lr.stopping = True
        return self._stopping(replicas, fresh, request)

    async def _stopping(
        self,
        replicas: list[LocalReplica],
        fresh: list[LocalReplica],
        request: JobPreemptionRequested | None,
    ) -> None:
        grace = self.state.settings.preemption_grace_s
        await terminate(fresh, grace)
        # Replicas that an earlier request is already stopping end on that one's schedule.
        await wait_all((lr.finished for lr in replicas), grace + KILL_WAIT_S)
        if request is not None:
            att = self.attempts.get((request.job_id, request.attempt))
            if att is not None:
                await att.started.wait()
            await self._publish(
                JobPreempted(
                    id=f"{request.id}/done",
                    time=time.time(),
                    actor=self.config.actor,
                    causation=request.id,
                    job_id=request.job_id,
                    attempt=request.attempt,
                    reason=request.reason,
                    replicas=request.replicas,
                    checkpointed=att is not None and self._checkpointed(att),
                )
            )
        for lr in replicas:
            if not desired(self.state.jobs.get(lr.job_id), lr.attempt, lr.replica):
                self._drop(lr)

    def _sync_job(self, job_id: str) -> None:
        """Stop or forget local replicas of `job_id` that the log no longer wants here."""
        job = self.state.jobs.get(job_id)
        for att in [a for key, a in self.attempts.items() if key[0] == job_id]:
            for lr in list(att.replicas.values()):
                if desired(job, lr.attempt, lr.replica):
                    continue
                if lr.ended:
                    self._drop(lr)
                elif not lr.stopping:
                    self._log.info(
                        "stopping what the log no longer wants here",
                        job=job_id,
                        attempt=lr.attempt,
                        replica=lr.index,
                    )
                    self._spawn(self._stop([lr], None))

    def _checkpointed(self, att: LocalAttempt) -> bool:
        """Whether the checkpoint marker was touched since the attempt started here."""
        if not self.runtime.real:
            return False
        now = marker_mtime(att.checkpoint_dir)
        return now is not None and (att.baseline_mtime is None or now > att.baseline_mtime)

    # -- checkpoints -----------------------------------------------------------------------------

    async def _poll_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_poll_s)
            for att in list(self.attempts.values()):
                try:
                    await self._check_marker(att)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._log.exception("checkpoint poll failed", job=att.job_id)

    async def _check_marker(self, att: LocalAttempt) -> None:
        job = self.state.jobs.get(att.job_id)
        if (
            job is None
            or job.attempt != att.attempt
            or job.phase not in ("starting", "running")
            or job.stop_replicas
            or not job.held
            or job.held[0].node != self.node
            or not att.started.is_set()
        ):
            return
        mtime = marker_mtime(att.checkpoint_dir)
        if mtime is None or mtime <= max(att.last_checkpoint, att.baseline_mtime or 0.0):
            return
        att.checkpoints += 1
        att.last_checkpoint = mtime
        self._log.info("checkpoint", job=att.job_id, attempt=att.attempt, n=att.checkpoints)
        # Its time is the marker's mtime: when the checkpoint happened, and what a restarted
        # executor compares the marker with to know whether it was reported.
        await self._publish(
            JobCheckpointed(
                id=f"{att.job_id}/{att.attempt}/checkpoint/{att.checkpoints}",
                time=mtime,
                actor=self.config.actor,
                job_id=att.job_id,
                attempt=att.attempt,
            )
        )

    # -- plumbing --------------------------------------------------------------------------------

    async def _publish(self, event: Event) -> None:
        """Publish until stored: ids are deterministic, so a retry is never a duplicate."""
        while True:
            try:
                await self.log.publish(event)
                return
            except (nats.errors.Error, APIError, TimeoutError, OSError) as e:
                self._log.warning("publish failed, retrying", id=event.id, error=str(e))
                await asyncio.sleep(PUBLISH_RETRY_S)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("executor task failed", exc_info=task.exception())

    def _save_records(self) -> None:
        if not self.runtime.real:
            return
        records = [
            lr.workload.record
            for lr in self.local_replicas()
            if lr.workload is not None and lr.workload.record is not None
        ]
        save_records(self.records_path, records)

    async def close(self, stop_workloads: bool | None = None) -> None:
        """Stop watching. Workloads keep running (a restarted executor adopts them) unless
        `stop_workloads` (default: the config's `stop_workloads_on_exit`)."""
        if stop_workloads is None:
            stop_workloads = self.config.stop_workloads_on_exit
        if self._poller is not None:
            await cancel_and_wait(self._poller)
            self._poller = None
        if stop_workloads:
            running = [lr for lr in self.local_replicas() if not lr.ended]
            for lr in running:
                lr.stopping = True
            grace = self._view.state.settings.preemption_grace_s if self._view else 30.0
            await terminate(running, grace)
        await asyncio.gather(*(cancel_and_wait(task) for task in list(self._tasks)))


async def terminate(replicas: list[LocalReplica], grace_s: float) -> None:
    """SIGTERM, up to `grace_s` to exit, then SIGKILL; returns once they ended (or after
    KILL_WAIT_S more, if even SIGKILL does not end one)."""
    await wait_all((lr.launched for lr in replicas), None)
    live = [lr for lr in replicas if not lr.ended and lr.workload is not None]
    for lr in live:
        assert lr.workload is not None
        lr.workload.signal(signal.SIGTERM)
    if await wait_all((lr.finished for lr in live), grace_s):
        return
    for lr in live:
        if not lr.ended and lr.workload is not None:
            logger.info("grace period over: SIGKILL", job=lr.job_id, replica=lr.index)
            lr.workload.signal(signal.SIGKILL)
    if not await wait_all((lr.finished for lr in live), KILL_WAIT_S):
        logger.error("workload did not end after SIGKILL", jobs=[lr.job_id for lr in live])


async def wait_all(events: Iterable[asyncio.Event], within: float | None) -> bool:
    """Wait until every event is set, or `within` seconds; whether they all were."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    if not waits:
        return True
    _, pending = await asyncio.wait(waits, timeout=within)
    for task in pending:
        task.cancel()
    return not pending


# -- driving one or many executors -------------------------------------------------------------


class ExecutorGroup:
    """Runs executors on one log connection and one fold: one executor for a real node, or a
    hundred hollow ones for a benchmark. Each event is handed only to the executors of the
    nodes it concerns."""

    def __init__(self, log: JetStreamLog, executors: list[Executor]) -> None:
        self.log = log
        self.executors = executors
        self.by_node = {ex.node: ex for ex in executors}
        if len(self.by_node) != len(executors):
            raise ValueError("two executors for the same node")
        self.view = LogView()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask `run()` to return (after closing the executors)."""
        self._stop.set()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Register, replay, reconcile, then follow the log until `stop()` or cancelled.

        The following runs in a task of its own that is cancelled from here: nats-py waits
        with `asyncio.wait_for`, which on Python 3.11 can swallow a cancellation that arrives
        together with a message, so that task is cancelled until it is done."""
        follower = asyncio.create_task(self._follow(ready))
        stopped = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({follower, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if follower.done():
                follower.result()  # it only ends by failing
        finally:
            stopped.cancel()
            await cancel_and_wait(follower)
            await asyncio.gather(
                *(asyncio.shield(ex.close()) for ex in self.executors), return_exceptions=True
            )

    async def _follow(self, ready: asyncio.Event | None) -> None:
        await self.log.ensure_stream()
        await asyncio.gather(*(ex.register() for ex in self.executors))
        async for stored in self.log.read(1):
            self.view.apply(stored)
        for ex in self.executors:
            await ex.reconcile(self.view)
        logger.info(
            "replayed and reconciled", seq=self.view.last_seq, executors=len(self.executors)
        )
        if ready is not None:
            ready.set()
        events = self._events(self.view.last_seq + 1)
        while True:
            try:
                stored = await anext(events)
            except Exception as e:  # a consumer failure the log layer did not absorb
                logger.warning("following the log failed, again", error=repr(e))
                await asyncio.sleep(FOLLOW_RETRY_S)
                events = self._events(self.view.last_seq + 1)
                continue
            if stored.seq <= self.view.last_seq:
                continue  # already applied (a consumer made again may repeat itself)
            self.view.apply(stored)
            self._dispatch(stored.event)

    def _events(self, from_seq: int) -> AsyncIterator[Stored]:
        # The seam for narrowing what an executor reads (see the module docstring).
        return self.log.follow(from_seq)

    def _dispatch(self, event: Event) -> None:
        for ex in self._concerned(event):
            try:
                ex.on_event(event)
            except Exception:
                logger.exception("executor failed on an event", node=ex.node, id=event.id)

    def _concerned(self, event: Event) -> list[Executor]:
        if isinstance(event, NodeLost):
            ex = self.by_node.get(event.node)
            return [ex] if ex is not None else []
        job_id = getattr(event, "job_id", None)
        if job_id is None:
            return []
        nodes: set[str] = set(self.view.holders.get(job_id, ()))
        job = self.state_job(job_id)
        if job is not None:
            nodes.update(r.node for r in job.held)
        if isinstance(event, JobScheduled):
            nodes.update(r.node for r in event.replicas)
        return [self.by_node[n] for n in nodes if n in self.by_node]

    def state_job(self, job_id: str) -> Job | None:
        return self.view.state.jobs.get(job_id)
