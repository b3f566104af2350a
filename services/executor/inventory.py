"""What the actuator holds of each replica and attempt here: their facts, their handles, and
the tasks that carry actions out.

The facts (`facts.ReplicaFacts`, `facts.AttemptFacts`) are plain data the planner reads; a
`Handle` is what goes with a replica beside them (its workload, its endpoint token, its
checkpoint folder and what of it was stored). Every change to a fact sets `changed`, on which
the executor plans again. The starting, watching, checkpointing and taking up modules all
keep their facts here, so none of them refers to another through the actuator.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Set
from dataclasses import dataclass, field
from hmac import compare_digest
from pathlib import Path
from typing import Final

import structlog

from events.model import Replica
from services.executor.config import ExecutorConfig
from services.executor.facts import AttemptFacts, AttemptKey, ReplicaFacts, ReplicaKey
from services.executor.local import marker_mtime
from services.executor.runtime import Runtime, Workload, checkpoint_dir, save_records
from services.runtime.clock import Clock

logger = structlog.get_logger("fairlane.executor")

#: Tokens of forgotten replicas remembered, to refuse them as stale rather than unknown.
STALE_KEPT: Final = 4096


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


def attempt_of(key: ReplicaKey) -> AttemptKey:
    return (key[0], key[1])


class Inventory:
    """The replicas and attempts here, as facts and handles; the tasks running for them."""

    def __init__(self, config: ExecutorConfig, runtime: Runtime, clock: Clock) -> None:
        self.node, self.runtime, self.clock = config.node, runtime, clock
        self.data_dir = config.data_dir.resolve()
        self.checkpoints = checkpoints_root(config, self.data_dir)
        self.replicas: dict[ReplicaKey, ReplicaFacts] = {}
        self.attempts: dict[AttemptKey, AttemptFacts] = {}
        #: how often each of the two changed: what the actuator keeps made from them between
        #: plans is made again when its count moved (`Actuator.here`)
        self.replica_changes = 0
        self.attempt_changes = 0
        self.handles: dict[ReplicaKey, Handle] = {}
        self.folders: dict[AttemptKey, Path] = {}  # whose marker counts for the attempt
        self.started: dict[AttemptKey, asyncio.Event] = {}  # set once `JobStarted` is in
        self.stale: OrderedDict[str, AttemptKey] = OrderedDict()
        self.changed = asyncio.Event()
        #: the jobs whose facts changed since the last plan took them (`take_touched`); None:
        #: the node's own (lost, closing, a shut down), after which everything is planned,
        #: as the first plan is
        self.touched: set[str] | None = None
        self.tasks: set[asyncio.Task[object]] = set()
        self.logger = logger.bind(node=config.node)

    # -- facts -------------------------------------------------------------------------------

    def set(self, key: ReplicaKey, **changes: object) -> None:
        facts = self.replicas.get(key)
        if facts is not None:
            self.replicas[key] = dataclasses.replace(facts, **changes)  # type: ignore[arg-type]
            self.replica_changes += 1
        self.touch(key[0])

    def set_attempt(self, key: AttemptKey, **changes: object) -> None:
        att = self.attempts.get(key)
        if att is not None:
            self.attempts[key] = dataclasses.replace(att, **changes)  # type: ignore[arg-type]
            self.attempt_changes += 1
        self.touch(key[0])

    def attempt(self, key: AttemptKey, first: int, announce: bool, scheduled: str | None) -> None:
        """The attempt's facts, made with its first replica here."""
        if key in self.attempts:
            return
        folder = checkpoint_dir(self.checkpoints, key[0], first)
        mark = marker_mtime(folder) if self.runtime.saves else None
        self.folders[key] = folder
        self.attempts[key] = AttemptFacts(
            key[0], key[1], announce=announce, scheduled_id=scheduled, baseline=mark, mark=mark
        )
        self.attempt_changes += 1
        started = self.started.setdefault(key, asyncio.Event())
        if not announce:
            started.set()

    def add(self, key: ReplicaKey, index: int, **facts: object) -> Handle:
        job_id, attempt, replica = key
        folder = checkpoint_dir(self.checkpoints, job_id, index)
        self.replicas[key] = ReplicaFacts(job_id, attempt, index, replica, **facts)  # type: ignore[arg-type]
        self.replica_changes += 1
        handle = Handle(job_id, attempt, index, replica, folder)
        self.handles[key] = handle
        self.touch(job_id)
        return handle

    def forget(self, key: ReplicaKey) -> None:
        facts, handle = self.replicas.pop(key, None), self.handles.pop(key, None)
        self.replica_changes += 1
        if handle is not None and handle.workload is not None and facts and facts.ended:
            handle.workload.discard()
        self.forgotten(handle)
        attempt = attempt_of(key)
        if not any(r.attempt_key == attempt for r in self.replicas.values()):
            self.attempts.pop(attempt, None)
            self.attempt_changes += 1
            self.folders.pop(attempt, None)
            self.started.pop(attempt, None)
        self.save_records()
        self.touch(key[0])

    def forgotten(self, handle: Handle | None) -> None:
        """A replica over and forgotten: its token is stale from now on (the endpoint says
        so rather than that it is unknown)."""
        if handle is not None and handle.token:
            self.stale[handle.token] = (handle.job_id, handle.attempt)
            while len(self.stale) > STALE_KEPT:
                self.stale.popitem(last=False)

    def save_records(self) -> None:
        """What a restarted executor finds its workloads by (`processes.json`)."""
        if not self.runtime.real:
            return
        records = [
            h.workload.record
            for h in self.handles.values()
            if h.workload is not None and h.workload.record is not None
        ]
        save_records(self.data_dir / "processes.json", records)

    def held_gpus(self) -> dict[AttemptKey, tuple[int, ...]]:
        """The GPU indexes of each attempt with a replica still running here."""
        held: dict[AttemptKey, set[int]] = {}
        for r in self.replicas.values():
            if not r.ended:
                held.setdefault(r.attempt_key, set()).update(r.replica.gpus)
        return {k: tuple(sorted(v)) for k, v in held.items()}

    def by_token(self, token: str) -> Handle | None:
        return next(
            (h for h in self.handles.values() if h.token and compare_digest(h.token, token)),
            None,
        )

    # -- tasks -------------------------------------------------------------------------------

    def spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("executor task failed", exc_info=task.exception())

    async def wake(self, job_id: str, after: float) -> None:
        """A plan of the job again once `after` seconds passed on the clock (a grace period
        over)."""
        await self.clock.sleep(after)
        self.touch(job_id)

    def touch(self, job_id: str | None) -> None:
        """The job's facts changed (None: the node's): plan it again."""
        if job_id is None:
            self.touched = None
        elif self.touched is not None:
            self.touched.add(job_id)
        self.changed.set()

    def take_touched(self) -> Set[str] | None:
        """The jobs touched since the last call (None: everything), and start afresh."""
        touched, self.touched = self.touched, set()
        return touched
