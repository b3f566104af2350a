"""Carrying the planner's actions out, and turning what happens back into facts.

The actuator owns this node's side effects: the runtime (processes, containers, hollow), the
cluster's checkpoint store and the workloads' output (both through the host), the log and the
workloads' endpoint. `act` records each action in
the facts at once (a replica starting, a stop sent, a report in flight), so the next plan does
not ask for it again, and runs what waits in tasks of its own; each task ends in an
observation (a replica ended, a checkpoint stored, a report in the log, a grace period over)
that updates the facts and sets `changed`, on which the executor plans again. Time comes from
the injected clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import signal
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from hmac import compare_digest
from pathlib import Path
from typing import Final

import msgspec
import structlog

from events import NODE_REPORTS, Event, ids
from events.model import Replica
from services.executor.config import ExecutorConfig
from services.executor.facts import (
    AttemptFacts,
    AttemptKey,
    Closing,
    Here,
    OverBound,
    ReplicaFacts,
    ReplicaKey,
)
from services.executor.gang import port_taken
from services.executor.launch import Site, launch_of
from services.executor.local import marker_mtime
from services.executor.logs import attempt_log_path
from services.executor.logship import ship_replica
from services.executor.nodework import NodeWork, desired
from services.executor.plan import (
    KILL_WAIT_S,
    Action,
    Counted,
    Forget,
    Kill,
    Register,
    Report,
    ShutdownReported,
    Start,
    Store,
    Terminate,
)
from services.executor.runtime import (
    SIGTERM_EXIT,
    TOKEN_ENV,
    Launch,
    ProcessRecord,
    Runtime,
    Workload,
    checkpoint_dir,
    save_records,
)
from services.executor.sampling import UsageTracker
from services.executor.shutdown import StoppedAttempt, forget_stopped, read_stopped, write_stopped
from services.executor.storage import ObjectCheckpoints, object_name
from services.runtime.clock import Clock
from services.runtime.eventlog import EventLog
from services.runtime.host import Host

logger = structlog.get_logger("fairlane.executor")

#: Tokens of forgotten replicas remembered, to refuse them as stale rather than unknown.
STALE_KEPT: Final = 4096
CANNOT_START: Final = 126  # the exit code reported for a replica that could not be started
LAST_LINE_BYTES: Final = 4096


@dataclass(eq=False)
class Handle:
    """What the actuator holds of one replica beside its facts."""

    job_id: str
    attempt: int
    index: int
    replica: Replica
    folder: Path
    workload: Workload | None = None
    token: str = ""
    saves: int = 0  # checkpoints the workload said it saved (through the endpoint)
    stored_saves: int = 0
    stored_mark: float | None = None
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)


def checkpoints_root(config: ExecutorConfig, data_dir: Path) -> Path:
    """Where the replicas' checkpoint folders are (`<job>/replica-<i>` under it): this node's
    data folder, or the folder every node shares."""
    storage = config.checkpoint_storage
    if storage.kind == "shared_fs" and storage.path is not None:
        return storage.path.resolve()
    return data_dir / "checkpoints"


class Actuator:
    def __init__(
        self,
        host: Host,
        config: ExecutorConfig,
        runtime: Runtime,
        clock: Clock,
        usage: UsageTracker,
    ) -> None:
        self.log: EventLog = host.log
        self.host, self.config = host, config
        self.runtime, self.clock = runtime, clock
        self.node = config.node
        self.data_dir = config.data_dir.resolve()
        self.checkpoints = checkpoints_root(config, self.data_dir)
        self.site = Site(self.node, self.checkpoints, self.data_dir)
        storage = config.checkpoint_storage
        #: The cluster's checkpoint store (None: a shared folder, or replicas that save nothing).
        self.objects = (
            ObjectCheckpoints(host.checkpoints(), storage.max_bytes)
            if storage.kind == "object_store" and runtime.saves
            else None
        )
        self.usage = usage
        self.replicas: dict[ReplicaKey, ReplicaFacts] = {}
        self.attempts: dict[AttemptKey, AttemptFacts] = {}
        self.handles: dict[ReplicaKey, Handle] = {}
        self.folders: dict[AttemptKey, Path] = {}  # whose marker counts for the attempt
        self.started: dict[AttemptKey, asyncio.Event] = {}
        self.reported: set[str] = set()
        self.published: set[str] = set()
        self.failed: set[str] = set()  # reports given up on
        self.stale: OrderedDict[str, AttemptKey] = OrderedDict()
        self.shut: dict[AttemptKey, float] = {}
        self.closing: Closing = ""
        self.lost = False
        self.registrations = 0
        self.endpoint_path: Path | None = None  # set by the executor's endpoint
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task[object]] = set()
        self.logger = logger.bind(node=config.node)

    # -- the facts -------------------------------------------------------------------------------

    def here(self, offer: Event | None = None) -> Here:
        attempts = {
            k: dataclasses.replace(a, utilization=self.usage.average(k))
            for k, a in self.attempts.items()
        }
        return Here(
            node=self.node,
            actor=self.config.actor,
            boot_id=self.config.boot_id,
            saves=self.runtime.saves,
            objects=self.objects is not None,
            attempts=attempts,
            replicas=dict(self.replicas),
            reported=frozenset(self.reported),
            published=frozenset(self.published),
            shut=dict(self.shut),
            closing=self.closing,
            lost=self.lost,
            registrations=self.registrations,
            offer=offer,  # type: ignore[arg-type]
        )

    def _set(self, key: ReplicaKey, **changes: object) -> None:
        facts = self.replicas.get(key)
        if facts is not None:
            self.replicas[key] = dataclasses.replace(facts, **changes)  # type: ignore[arg-type]
        self.changed.set()

    def _set_attempt(self, key: AttemptKey, **changes: object) -> None:
        att = self.attempts.get(key)
        if att is not None:
            self.attempts[key] = dataclasses.replace(att, **changes)  # type: ignore[arg-type]
        self.changed.set()

    def held_gpus(self) -> dict[AttemptKey, tuple[int, ...]]:
        """The GPU indexes of each attempt with a replica still running here."""
        held: dict[AttemptKey, set[int]] = {}
        for r in self.replicas.values():
            if not r.ended:
                held.setdefault(r.attempt_key, set()).update(r.replica.gpus)
        return {k: tuple(sorted(v)) for k, v in held.items()}

    # -- acting ----------------------------------------------------------------------------------

    def act(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Start():
                    self._start(action)
                case Terminate(key=key, grace_s=grace):
                    self._signal(key, signal.SIGTERM, stop_at=self.clock.now())
                    self.spawn(self._wake(grace))
                case Kill(key=key):
                    self.logger.warning("grace period over: SIGKILL", replica=key[:2])
                    self._signal(key, signal.SIGKILL, killed=True)
                    self.spawn(self._wake(KILL_WAIT_S))
                case Store(key=key, after_stop=after):
                    self._set(key, storing=True)
                    self.spawn(self._store(key, after))
                case Forget(key=key):
                    self._forget(key)
                case Report(event=event, within=within):
                    self.reported.add(event.id)
                    self.spawn(self._publish(event, within))
                case Counted(key=key, checkpoints=n, last=last):
                    self.logger.info("checkpoint", job=key[0], attempt=key[1], n=n)
                    self._set_attempt(key, checkpoints=n, last_checkpoint=last)
                case Register(event=event):
                    self.lost, self.registrations = False, self.registrations + 1
                    self.reported.add(event.id)
                    self.spawn(self._publish(event, 300.0))
                case ShutdownReported():
                    self.shut = {}
                    if self.runtime.real:
                        forget_stopped(self.data_dir)

    def _signal(self, key: ReplicaKey, sig: int, **changes: object) -> None:
        self._set(key, **changes)
        handle, facts = self.handles.get(key), self.replicas.get(key)
        if handle is not None and handle.workload is not None and facts and not facts.ended:
            handle.workload.signal(sig)

    async def _wake(self, after: float) -> None:
        await self.clock.sleep(after)
        self.changed.set()

    def spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("executor task failed", exc_info=task.exception())

    # -- replicas: start, watch, end -------------------------------------------------------------

    def _attempt(
        self, key: AttemptKey, first: int, announce: bool, scheduled_id: str | None
    ) -> None:
        """The attempt's facts, made with its first replica here."""
        if key in self.attempts:
            return
        folder = checkpoint_dir(self.checkpoints, key[0], first)
        mark = marker_mtime(folder) if self.runtime.saves else None
        self.folders[key] = folder
        self.attempts[key] = AttemptFacts(
            key[0], key[1], announce=announce, scheduled_id=scheduled_id, baseline=mark, mark=mark
        )
        started = self.started.setdefault(key, asyncio.Event())
        if not announce:
            started.set()

    def _add(self, key: ReplicaKey, index: int, **facts: object) -> Handle:
        job_id, attempt, replica = key
        folder = checkpoint_dir(self.checkpoints, job_id, index)
        self.replicas[key] = ReplicaFacts(job_id, attempt, index, replica, **facts)  # type: ignore[arg-type]
        handle = Handle(job_id, attempt, index, replica, folder)
        self.handles[key] = handle
        self.changed.set()
        return handle

    def _start(self, action: Start) -> None:
        job = action.job
        key = (job.job_id, job.attempt, action.replica)
        self._attempt(attempt_of(key), action.index, action.announce, action.scheduled_id)
        handle = self._add(key, action.index)
        launch = launch_of(job, action.index, action.replica, self.site)
        if self.endpoint_path is not None:
            launch.env["FAIRLANE_EVENTS"] = str(self.endpoint_path)
            launch.env[TOKEN_ENV] = handle.token = secrets.token_urlsafe(24)
        self.logger.info("starting", job=job.job_id, attempt=job.attempt, replica=action.index)
        self.spawn(self._run(key, handle, launch))

    async def _run(self, key: ReplicaKey, handle: Handle, launch: Launch | None) -> None:
        """Start (or, with no `launch`, watch an adopted) replica until it ends."""
        if self.runtime.real:  # its output, to the log stream as it comes
            self.spawn(self._ship(handle))
        if launch is not None and not await self._launch(key, handle, launch):
            return
        assert handle.workload is not None
        self._set(key, launched=True, has_workload=True)
        handle.launched.set()
        code = await handle.workload.wait()
        self.logger.info("workload ended", replica=key[:2], index=handle.index, exit_code=code)
        self._ended(key, handle, code, handle.workload.failure or "")

    async def _launch(self, key: ReplicaKey, handle: Handle, launch: Launch) -> bool:
        """Fetch its checkpoint, check its rendezvous port, start it; False: not started."""
        attempt = self.attempts.get(attempt_of(key))
        await self._fetch(key, handle)
        handle.stored_mark = marker_mtime(launch.checkpoint_dir)  # older saves are not its own
        facts = self.replicas.get(key)
        if facts is None or facts.stop_at is not None:  # asked to stop before it started
            self._ended(key, handle, SIGTERM_EXIT, "")
            return False
        if (why := self._port_taken(launch)) is not None:
            self.logger.error("a port is taken", job=key[0], why=why)
            self._ended(key, handle, CANNOT_START, why)
            return False
        try:
            baseline = attempt.baseline if attempt is not None else None
            handle.workload = await self.runtime.start(launch, self.node, baseline)
        except Exception:  # the node cannot start it (a full disk, ...): the attempt fails
            self.logger.exception("could not start", job=key[0], replica=handle.index)
            self._ended(key, handle, CANNOT_START, "")
            return False
        self.save_records()
        facts = self.replicas.get(key)
        if facts is not None and facts.stop_at is not None:  # asked to stop while starting
            handle.workload.signal(signal.SIGTERM)
        return True

    def _port_taken(self, launch: Launch) -> str | None:
        """Why the replica cannot start here, where something outside Fairlane already
        listens on a port it needs (the policy never gives one node's port to two replicas):
        the attempt's rendezvous port, where replica 0 is to start here, instead of its
        replicas waiting for a master that cannot bind; or a host port it publishes
        (`--port`), instead of a workload that fails to serve. The attempt fails at once."""
        if not self.runtime.real:
            return None
        port = launch.env.get("MASTER_PORT")
        if launch.replica == 0 and port is not None and port_taken(int(port)):
            return (
                f"the rendezvous port {port} (MASTER_PORT) on {self.node} is taken by another "
                "process: nothing was started; the next attempt gets another port"
            )
        for mapping in launch.ports:
            if port_taken(mapping.host):
                return (
                    f"host port {mapping.host} (--port {mapping.host}:{mapping.container}) on "
                    f"{self.node} is taken by a program outside Fairlane: nothing was started"
                )
        return None

    def _ended(self, key: ReplicaKey, handle: Handle, code: int | None, detail: str) -> None:
        if code not in (None, 0) and not detail:
            path = attempt_log_path(self.data_dir, key[0], key[1], handle.index)
            detail = last_line(path)
        self._set(key, launched=True, ended=True, exit_code=code, detail=detail)
        self._look(attempt_of(key))
        handle.launched.set()
        handle.finished.set()

    async def _ship(self, handle: Handle) -> None:
        await ship_replica(
            self.host.output(),
            attempt_log_path(self.data_dir, handle.job_id, handle.attempt, handle.index),
            (self.node, handle.job_id, handle.attempt, handle.index),
            handle.launched,
            handle.finished,
        )

    def _forget(self, key: ReplicaKey) -> None:
        facts, handle = self.replicas.pop(key, None), self.handles.pop(key, None)
        if handle is not None and handle.workload is not None and facts and facts.ended:
            handle.workload.discard()
        self.forgotten(handle)
        attempt = attempt_of(key)
        if not any(r.attempt_key == attempt for r in self.replicas.values()):
            self.attempts.pop(attempt, None)
            self.folders.pop(attempt, None)
            self.started.pop(attempt, None)
        self.save_records()
        self.changed.set()

    def forgotten(self, handle: Handle | None) -> None:
        """A replica over and forgotten: its token is stale from now on (the endpoint says
        so rather than that it is unknown)."""
        if handle is not None and handle.token:
            self.stale[handle.token] = (handle.job_id, handle.attempt)
            while len(self.stale) > STALE_KEPT:
                self.stale.popitem(last=False)

    def save_records(self) -> None:
        if not self.runtime.real:
            return
        records = [
            h.workload.record
            for h in self.handles.values()
            if h.workload is not None and h.workload.record is not None
        ]
        save_records(self.data_dir / "processes.json", records)

    # -- checkpoints -----------------------------------------------------------------------------

    def _look(self, key: AttemptKey) -> None:
        """The attempt's marker as it is now."""
        folder = self.folders.get(key)
        if folder is not None and self.runtime.saves:
            self._set_attempt(key, mark=marker_mtime(folder))

    def look_all(self) -> None:
        """The poll: every attempt's marker, and which running replicas saved since stored."""
        for key in list(self.attempts):
            self._look(key)
        for rkey, facts in list(self.replicas.items()):
            handle = self.handles.get(rkey)
            if handle is not None and not facts.ended and not facts.storing:
                if self._unsaved(handle) != facts.unsaved:
                    self._set(rkey, unsaved=not facts.unsaved)

    def _unsaved(self, handle: Handle) -> bool:
        if self.objects is None:
            return False
        if handle.saves > handle.stored_saves:
            return True
        mark = marker_mtime(handle.folder)
        return mark is not None and (handle.stored_mark is None or mark > handle.stored_mark)

    async def _store(self, key: ReplicaKey, after_stop: bool) -> None:
        """Store the replica's folder if it saved since it was last stored; a folder over the
        bound is not stored (the planner puts that on the job's timeline)."""
        handle = self.handles.get(key)
        changes: dict[str, object] = {"storing": False, "unsaved": False}
        if after_stop:
            changes["stored_after_stop"] = True
        try:
            if handle is not None and self.objects is not None and self._unsaved(handle):
                changes.update(await self._put(handle, after_stop))
        except Exception:
            self.logger.exception("checkpoint not stored", job=key[0], replica=key[1:])
        self._set(key, **changes)
        self._look(attempt_of(key))

    async def _put(self, handle: Handle, after_stop: bool) -> dict[str, object]:
        assert self.objects is not None
        mark, saves = marker_mtime(handle.folder), handle.saves
        stored = await self.objects.store(handle.folder, object_name(handle.job_id, handle.index))
        handle.stored_mark, handle.stored_saves = mark, saves
        if stored.over_bound:
            bound = self.objects.max_bytes
            self.logger.warning("checkpoint over the bound: not stored", size=stored.size)
            over = OverBound(saves, mark, stored.size, bound)
            return {"over_bound": over, "size": stored.size, "refused": True}
        if stored.digest is None:
            return {}
        self.logger.info("checkpoint stored", object=stored.name, size=stored.size)
        stored_bytes = stored.size if after_stop else 0
        return {"size": stored.size, "refused": False, "stored_bytes": stored_bytes}

    async def _fetch(self, key: ReplicaKey, handle: Handle) -> None:
        """Before a later attempt's replica starts here: its folder made the stored
        checkpoint, where this node's copy is not it; a failure starts it from what is here."""
        if self.objects is None or handle.attempt <= 1:
            return
        try:
            size = await self.objects.fetch(handle.folder, object_name(key[0], handle.index))
        except Exception as e:  # the store away, a digest that does not match
            self.logger.exception("checkpoint not fetched", job=key[0], replica=handle.index)
            self._set(key, fetch_error=repr(e))
            return
        if size is not None:
            self.logger.info("checkpoint fetched", job=key[0], replica=handle.index, size=size)

    def saved(self, handle: Handle) -> None:
        """The workload said it saved a checkpoint: stored at the next poll."""
        handle.saves += 1
        self._set_attempt((handle.job_id, handle.attempt), saved_by_workload=True)

    # -- the log ---------------------------------------------------------------------------------

    async def publish(self, event: Event, give_up_after: float = 300.0) -> None:
        """Publish until stored: ids are deterministic, so a retry is never a duplicate. A
        report of an attempt here names this node: the server takes one only on this node's
        subject, and the fold only from a node the attempt has a replica on."""
        if isinstance(event, NODE_REPORTS) and event.node is None:
            event = msgspec.structs.replace(event, node=self.node)
        await self.log.publish_durably(event, give_up_after=give_up_after)

    async def _publish(self, event: Event, within: float) -> None:
        try:
            await self.publish(event, give_up_after=within)
        except Exception as e:  # given up: it stays in `reported`, never asked for again
            self.logger.error("not reported", id=event.id, error=str(e) or repr(e))
            self.failed.add(event.id)
            self.changed.set()
            return
        self.published.add(event.id)
        job_id, attempt = getattr(event, "job_id", None), getattr(event, "attempt", None)
        if isinstance(job_id, str) and isinstance(attempt, int):
            if event.id == ids.started(job_id, attempt) and (job_id, attempt) in self.started:
                self.started[(job_id, attempt)].set()
        self.changed.set()

    # -- after a restart, and closing ------------------------------------------------------------

    def take_up(self, work: NodeWork, found: list[ProcessRecord]) -> None:
        """What an earlier run of this executor left: workloads found running are adopted,
        replicas the log says run here with nothing found are ended with no status (lost, or
        stopped by the last shut down, whose file names it); the planner does the rest."""
        recorded = {(r.job_id, r.attempt, Replica(r.node, r.gpus)): r for r in found}
        marks = read_stopped(self.data_dir) if self.runtime.real else {}
        for job in list(work.jobs.values()):
            orders = work.stops_of(job.job_id)
            mark = marks.get((job.job_id, job.attempt))
            if mark is not None and all(o.reason == "shutdown" for o in orders):
                self.shut[(job.job_id, job.attempt)] = mark.at
            self._take_up_job(work, job.job_id, recorded, mark is not None)
        for key, record in recorded.items():  # not wanted by the log any more: stopped
            self._attempt(attempt_of(key), record.replica, False, None)
            self._adopt(key, record.replica, self.runtime.adopt(record), record.token)
        self.save_records()

    def _take_up_job(
        self, work: NodeWork, job_id: str, recorded: dict[ReplicaKey, ProcessRecord], shut: bool
    ) -> None:
        job = work.jobs[job_id]
        here = [(i, r) for i, r in enumerate(job.held) if r.node == self.node]
        if (
            job.phase == "starting"
            and not shut
            and not any((job_id, job.attempt, r) in recorded for _, r in here)
        ):
            return  # placed while the executor was down: the planner starts it
        announce = job.held[0].node == self.node and job.phase == "starting" and not shut
        key = (job_id, job.attempt)
        self._attempt(key, here[0][0], announce, work.scheduled.get(job_id))
        n, last = work.checkpoints_of(job_id, job.attempt)
        self._set_attempt(key, checkpoints=n, last_checkpoint=last)
        for index, replica in here:
            rkey = (job_id, job.attempt, replica)
            record = recorded.pop(rkey, None)
            if record is not None:
                self._set_attempt(key, baseline=record.checkpoint_mtime)
                workload = self.runtime.adopt(record)
                self._adopt(rkey, index, workload, record.token)
                self.logger.info("adopted", job=job_id, replica=index, alive=workload.alive())
                continue
            launch = launch_of(job, index, replica, self.site)
            if (unrecorded := self.runtime.adopt_unrecorded(launch)) is not None:
                self._adopt(rkey, index, unrecorded, "")
            elif shut or job.phase != "starting":
                if not shut:
                    self.logger.warning(
                        "no record of a replica the log runs here: lost", job=job_id
                    )
                self._add(rkey, index, launched=True, ended=True)
            # else: placed while the executor was down, never started: the planner starts it

    def _adopt(self, key: ReplicaKey, index: int, workload: Workload, token: str) -> None:
        handle = self._add(key, index)
        handle.workload, handle.token = workload, token
        self.spawn(self._run(key, handle, None))

    def shut_down(self, work: NodeWork) -> None:
        """A shut down: every attempt the log wants running here, and no stop covers, is to be
        stopped and reported; the file names them first."""
        now = self.clock.now()
        keys = sorted(
            {
                r.attempt_key
                for r in self.replicas.values()
                if not r.ended
                and r.stop_at is None
                and desired(work.jobs.get(r.job_id), r.attempt, r.replica)
                and not work.stops_of(r.job_id)
            }
        )
        self.shut.update({k: now for k in keys})
        if keys and self.runtime.real:  # a hollow replica leaves nothing to find
            write_stopped(self.data_dir, [StoppedAttempt(k[0], k[1], now) for k in keys])
        if keys:
            self.logger.info("shutting down: stopping the jobs here", jobs=[k[0] for k in keys])
        self.closing = "shutdown"
        self.changed.set()

    def busy(self) -> bool:
        """Whether anything started here still runs, or a store or a report is in flight."""
        running = any(not r.ended for r in self.replicas.values())
        storing = any(r.storing for r in self.replicas.values())
        return running or storing or bool(self.reported - self.published - self.failed)

    def by_token(self, token: str) -> Handle | None:
        return next(
            (h for h in self.handles.values() if h.token and compare_digest(h.token, token)),
            None,
        )


def attempt_of(key: ReplicaKey) -> AttemptKey:
    return (key[0], key[1])


def last_line(path: Path) -> str:
    """The last line of a log file (at most 200 characters), or ''."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - LAST_LINE_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
