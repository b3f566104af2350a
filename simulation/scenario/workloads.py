"""Replicas on the virtual clock: the runtime the real node executor runs a scenario's jobs
with in the in-process engine (`simulation/scenario/in_process.py`).

A replica is no process: it runs until the scenario ends it. A job with a `duration` does the
work the core engine simulates (`simulation/virtual_cluster.py`'s `Work`: progress from its
start, after its restore time when it resumes; a checkpoint every `every` seconds of progress;
a stop keeps what the last checkpoint saved), shared by all its replicas on every node, so
they finish together; any job ends on a `complete` (exit 0) or `fail` (exit 1) step. A
checkpoint is what a real workload leaves: the `.checkpoint` marker in each replica's folder,
touched at the virtual moment, which the executor reports (`JobCheckpointed`) and stores as it
does a process's. On SIGTERM a replica that has a checkpoint saves again (the marker) and
exits 143 at once; the executor stores its folder and reports the stop.

Each executor has a runtime of its own (`ScenarioRuntime`), told how to have its executor look
at the markers at once (a process's executor polls for them: here a save is seen at the moment
it is made, not at the next poll, so the scenario's clock can move on right after).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from events import JobSpec
from services.executor.local import CHECKPOINT_MARKER
from services.executor.runtime import Launch, ProcessRecord, Workload
from services.runtime.clock import VirtualClock
from services.runtime.tasks import cancel_and_wait
from simulation.virtual_cluster import Work

#: The exit codes of a scenario's `complete` and `fail` steps (the core engine's JobFailed).
COMPLETE, FAIL = 0, 1


class ScenarioWorkload:
    """One replica: alive until its job's work finishes, the scenario ends it, or a signal."""

    def __init__(self, run: JobRun, attempt: int, folder: Path, look: Callable[[], None]) -> None:
        self.run, self.attempt, self.folder, self.look = run, attempt, folder, look
        self._ended = asyncio.Event()
        self._code: int | None = None

    @property
    def record(self) -> ProcessRecord | None:
        return None  # nothing outlives the executor to find again

    @property
    def failure(self) -> str | None:
        return None

    def alive(self) -> bool:
        return not self._ended.is_set()

    async def wait(self) -> int | None:
        await self._ended.wait()
        return self._code

    def signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL) and self.alive():
            if self.run.saved_any(self.run.clock.now()):
                self.save()  # as a trainer saves on SIGTERM
            self.end(128 + sig)
            self.run.left(self)

    def discard(self) -> None:
        pass

    def end(self, code: int | None) -> None:
        if self.alive():
            self._code = code
            self._ended.set()

    def save(self) -> None:
        """Touch the marker at the clock's moment, and have the executor look now."""
        self.folder.mkdir(parents=True, exist_ok=True)
        marker = self.folder / CHECKPOINT_MARKER
        marker.touch()
        moment = self.run.clock.now()
        os.utime(marker, (moment, moment))
        self.look()


@dataclass(eq=False)
class JobRun:
    """A job's work in the scenario, shared by its replicas wherever they run."""

    job_id: str
    clock: VirtualClock
    work: Work | None  # None: no duration; it runs until a step ends it
    attempt: int = 0
    live: set[ScenarioWorkload] = field(default_factory=set)
    driver: asyncio.Task[None] | None = None

    def joined(self, workload: ScenarioWorkload) -> None:
        """A replica started: the first of a new attempt starts the attempt's work."""
        if workload.attempt != self.attempt:
            self.stop_driving()
            self.attempt, self.live = workload.attempt, set()
            if self.work is not None:
                self.work.start(self.clock.now(), resumed=workload.attempt > 1)
                self.driver = asyncio.create_task(self._drive(self.work))
        self.live.add(workload)

    def left(self, workload: ScenarioWorkload) -> None:
        """A replica was stopped: once none runs, the attempt's work stops where it saved."""
        self.live.discard(workload)
        if not self.live and workload.attempt == self.attempt:
            self.stop_driving()
            if self.work is not None and self.work.run_from is not None:
                self.work.stop(self.clock.now())

    def lost(self, workload: ScenarioWorkload) -> None:
        """Its node went away with it: the work keeps what it saved (as on the core engine,
        where a lost node's jobs resume from their last checkpoint)."""
        self.live.discard(workload)
        if not self.live:
            self.stop_driving()

    def finish(self, code: int) -> None:
        for workload in list(self.live):
            workload.end(code)
        self.live.clear()
        self.stop_driving()

    def saved_any(self, now: float) -> bool:
        """Whether a stop now keeps a checkpoint (the core engine's `checkpointed`)."""
        work = self.work
        if work is None or work.every is None:
            return False
        return int(work.progress(now) / work.every) * work.every > 0

    def stop_driving(self) -> None:
        if self.driver is not None and self.driver is not asyncio.current_task():
            self.driver.cancel()
        self.driver = None

    async def _drive(self, work: Work) -> None:
        """The attempt's checkpoints as they fall due, then its finish (a finish wins over a
        checkpoint at the same moment), as the core engine has them."""
        while True:
            finish, save = work.finishes_at(), work.next_checkpoint_at()
            assert finish is not None
            due = finish if save is None else min(finish, save)
            await self.clock.sleep(due - self.clock.now())
            if due == finish:
                self.finish(COMPLETE)
                return
            assert work.every is not None and work.run_from is not None
            done = work.progress(self.clock.now())
            step = (int(work.saved / work.every) + 1) * work.every
            kept = max(int(done / work.every) * work.every, step)  # as the core's float guard
            work.run_from, work.saved = self.clock.now() - (done - kept), kept
            for workload in sorted(self.live, key=lambda w: str(w.folder)):
                workload.save()


@dataclass
class ScenarioWork:
    """Every job's work in one scenario, for the runtimes of all its nodes."""

    clock: VirtualClock
    runs: dict[str, JobRun] = field(default_factory=dict)

    def submitted(self, job_id: str, spec: JobSpec) -> None:
        work = None
        if spec.duration_s is not None:
            cp = spec.checkpoint
            every, restore = (cp.every_s, cp.restore_s) if cp else (None, 0.0)
            work = Work(duration=spec.duration_s, every=every, restore=restore)
        self.runs[job_id] = JobRun(job_id, self.clock, work)

    def run_of(self, job_id: str) -> JobRun:
        if job_id not in self.runs:  # submitted before the scenario's own steps: no work
            self.runs[job_id] = JobRun(job_id, self.clock, None)
        return self.runs[job_id]

    def finish(self, job_id: str, code: int) -> None:
        """The scenario ends the job's replicas with `code` (its `complete` or `fail`)."""
        run = self.runs.get(job_id)
        if run is not None:
            run.finish(code)

    async def close(self) -> None:
        for run in self.runs.values():
            if run.driver is not None:
                await cancel_and_wait(run.driver)


class ScenarioRuntime:
    """One node's runtime: starts a job's replicas on its shared work; `look` is how its
    executor is told to look at the markers (set once the executor is made)."""

    name = "scenario"
    real = False  # no output, records, endpoint or ports: nothing runs
    saves = True  # the markers and folders are there, as a process's

    def __init__(self, work: ScenarioWork) -> None:
        self.work = work
        self.look: Callable[[], None] = lambda: None
        self.started: set[ScenarioWorkload] = set()

    async def start(self, launch: Launch, node: str, checkpoint_mtime: float | None) -> Workload:
        run = self.work.run_of(launch.job_id)
        workload = ScenarioWorkload(run, launch.attempt, launch.checkpoint_dir, self._look)
        run.joined(workload)
        self.started = {w for w in self.started if w.alive()} | {workload}
        return workload

    def _look(self) -> None:
        self.look()

    async def found(self, records_path: Path, node: str) -> list[ProcessRecord]:
        return []

    def adopt(self, record: ProcessRecord) -> Workload:
        raise RuntimeError("a scenario's replicas leave no record to adopt")

    def adopt_unrecorded(self, launch: Launch) -> Workload | None:
        return None

    async def close(self) -> None:
        """The node goes away: its replicas with it, unreported."""
        for workload in self.started:
            if workload.alive():
                workload.run.lost(workload)
                workload.end(None)
        self.started.clear()
