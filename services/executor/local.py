"""What runs on this node: the attempts and replicas an executor looks after."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeAlias

from events.model import Replica
from services.executor.runtime import Workload

CHECKPOINT_MARKER: Final = ".checkpoint"

AttemptKey: TypeAlias = tuple[str, int]


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
    token: str = ""  # its attempt's token for the workload events endpoint
    failure: str = ""  # why it was not started, where the executor itself refused
    #: checkpoints the workload said it saved (`fairlane.workload`), and how many of them and
    #: which marker mtime its stored checkpoint includes (see `storage`)
    saves: int = 0
    stored_saves: int = 0
    stored_mark: float | None = None
    stored_bytes: int | None = None  # the size of the object last stored from here
    stored_at: float = 0.0  # when (monotonic) it was stored
    store_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
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
    #: The checkpoint folder of the job's first replica here (replica 0's where it runs
    #: here): its `.checkpoint` marker is the one polled.
    checkpoint_dir: Path
    #: The checkpoint marker's mtime before this attempt started here (None: no marker).
    baseline_mtime: float | None
    #: Set once `JobStarted` is in the log, or when it is not this executor's to report:
    #: later reports about the attempt wait for it, so the timeline stays in order.
    started: asyncio.Event = field(default_factory=asyncio.Event)
    replicas: dict[Replica, LocalReplica] = field(default_factory=dict)
    checkpoints: int = 0
    last_checkpoint: float = 0.0
    #: The workload said it saved a checkpoint (through the events endpoint).
    saved_by_workload: bool = False
    scheduled_id: str | None = None


def marker_mtime(directory: Path) -> float | None:
    try:
        return (directory / CHECKPOINT_MARKER).stat().st_mtime
    except OSError:
        return None
