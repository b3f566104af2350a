"""The policy plus simulated node executors on a virtual clock.

This is what `scenario run --engine core` and `fairlane simulate` drive. Commands become the
same events the services would publish; the policy (`policy.cycle.decide`, `policy.commands`)
decides; simulated executors answer its decisions at once (a start is reported, a victim stops
within its grace period) and finish work when its `duration` is done. Nothing here reads a clock
or does I/O, so a run is a pure function of its inputs.

Work model (for jobs with a `duration`): an attempt makes progress from its start, after its
restore time when it resumes; with a checkpoint model it saves every `every` seconds of progress
and a preemption loses what was done since the last save; without one it loses everything.

Finishes and checkpoints fall due from a heap, so moving the clock costs O(log n) per due item
rather than a scan of every job with work. Two switches exist for trace-sized runs (the
simulator): `keep_log=False` keeps events out of `log` (the observer still sees each one), and
`settle_on_checkpoint=False` records checkpoints when they fall due without running a cycle for
an instant at which nothing else happened.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from events import (
    ClusterConfigured,
    Event,
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobPreemptionRequested,
    JobRejected,
    JobScheduled,
    JobSpec,
    JobStarted,
    NodeLost,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    ids,
)
from events.commands import AnyCommand, CancelJob, PauseJob, ResumeJob, SetPool, SubmitJob
from policy.commands import Accepted, Outcome, Refused, decide_command
from policy.cycle import decide, next_wakeup
from policy.state import ClusterState, Job, Verdict

#: A finish or checkpoint that falls due: (time, job seq, kind, job id). The order is the order
#: in which simultaneous items are handled.
Due = tuple[float, int, str, str]

EXECUTOR = "executor"
USER = "user"
#: A cycle that keeps deciding things this many times without settling is a policy bug.
MAX_ROUNDS = 10_000


class NotSettled(RuntimeError):
    """The policy kept making decisions: a ping-pong that the rules should have prevented."""


@dataclass(slots=True)
class Work:
    """Progress of one job with a duration, in seconds of work."""

    duration: float
    every: float | None
    restore: float
    saved: float = 0.0  # progress kept by the last checkpoint
    run_from: float | None = None  # when the current attempt started making progress

    def progress(self, now: float) -> float:
        if self.run_from is None or now < self.run_from:
            return self.saved
        return self.saved + (now - self.run_from)

    def finishes_at(self) -> float | None:
        if self.run_from is None:
            return None
        return self.run_from + (self.duration - self.saved)

    def next_checkpoint_at(self) -> float | None:
        if self.run_from is None or self.every is None:
            return None
        step = (int(self.saved / self.every) + 1) * self.every
        if step >= self.duration:
            return None
        return self.run_from + (step - self.saved)

    def start(self, now: float, resumed: bool) -> None:
        """An attempt starts: progress from now (after restoring its checkpoint, if resumed)."""
        self.run_from = now + (self.restore if resumed else 0.0)

    def stop(self, now: float) -> bool:
        """The whole attempt stops: keep what the last checkpoint saved; whether it saved any."""
        done = self.progress(now)
        self.saved = (int(done / self.every) * self.every) if self.every else 0.0
        self.run_from = None
        return self.every is not None and self.saved > 0


def started(event: JobScheduled, now: float) -> JobStarted:
    """The simulated executor's report that a placement's attempt started."""
    return JobStarted(
        id=ids.started(event.job_id, event.attempt),
        time=now,
        actor=EXECUTOR,
        causation=event.id,
        job_id=event.job_id,
        attempt=event.attempt,
        resumed=event.attempt > 1,
    )


def preempted(event: JobPreemptionRequested, now: float, checkpointed: bool) -> JobPreempted:
    """The simulated executor's report that it stopped what a request asked it to."""
    return JobPreempted(
        id=ids.stopped(event.id),
        time=now,
        actor=EXECUTOR,
        causation=event.id,
        job_id=event.job_id,
        attempt=event.attempt,
        reason=event.reason,
        replicas=event.replicas,
        checkpointed=checkpointed,
    )


@dataclass
class VirtualCluster:
    state: ClusterState = field(default_factory=ClusterState)
    now: float = 0.0
    log: list[Event] = field(default_factory=list)
    work: dict[str, Work] = field(default_factory=dict)
    #: Called with every event as it is recorded (the simulator measures from these).
    observer: Callable[[Event], None] | None = None
    #: False: events are not kept in `log` (a trace replay would hold millions of them).
    keep_log: bool = True
    #: False: an instant at which only checkpoints fall due gets no cycle of its own. A
    #: checkpoint frees and queues nothing; it changes only what a victim would lose, which the
    #: next cycle (at the next arrival, finish or timer) reads from the state.
    settle_on_checkpoint: bool = True
    #: Finishes and checkpoints, pushed whenever an attempt's progress is re-anchored. Entries
    #: go stale (preemption, a later re-anchor, completion) and are checked when they surface.
    _due: list[Due] = field(default_factory=list)
    #: Whether any job has a preemption_delay or min_runtime: without one, `next_wakeup` (a scan
    #: of every live job) can only answer None.
    _timers: bool = False

    def __post_init__(self) -> None:
        self._timers = any(
            j.preemption_delay_s > 0 or j.min_runtime_s > 0 for j in self.state.jobs.values()
        )

    # -- recording -------------------------------------------------------------------------------

    def record(self, event: Event) -> Verdict:
        verdict = self.state.apply(event)
        if self.keep_log:
            self.log.append(event)
        if isinstance(event, JobAdmitted) and (
            event.preemption_delay_s > 0 or event.min_runtime_s > 0
        ):
            self._timers = True
        if self.observer is not None:
            self.observer(event)
        return verdict

    # -- configuration ---------------------------------------------------------------------------

    def configure(self, event: ClusterConfigured) -> None:
        self.record(event)

    def add_pool(self, name: str, configured: PoolConfigured | None = None) -> None:
        """A pool, as configured (its own scheduler settings) or following the cluster's."""
        if configured is None:
            self.command(SetPool(pool=name))
        else:
            self.record(configured)

    def add_node(self, name: str, pool: str, gpus: int) -> None:
        self.record(
            NodeRegistered(
                id=ids.node_registered(name, self.state.events_applied),
                time=self.now,
                actor=EXECUTOR,
                node=name,
                pool=pool,
                gpus=gpus,
            )
        )

    def remove_node(self, name: str) -> None:
        self.record(
            NodeLost(
                id=ids.node_lost(name, self.state.events_applied),
                time=self.now,
                actor=EXECUTOR,
                node=name,
                reason="lost",
            )
        )

    def set_project(self, name: str, terms: dict[str, ProjectTerms]) -> None:
        """A project's complete terms (`command(SetProject(...))` changes one pool's)."""
        self.record(
            ProjectConfigured(
                id=ids.project_configured(name, self.state.events_applied),
                time=self.now,
                actor=USER,
                project=name,
                terms=terms,
            )
        )

    # -- user commands ---------------------------------------------------------------------------

    def command(self, command: AnyCommand) -> Outcome:
        """Answer a command as admission or the ledger does (`policy.commands`), and record the
        events it leads to."""
        outcome = decide_command(self.state, command, self.now, self.state.events_applied)
        if isinstance(outcome, Accepted):
            for event in outcome.events:
                self.record(event)
        return outcome

    def submit(self, job_id: str, spec: JobSpec) -> JobAdmitted | JobRejected | Refused:
        """Submit and admit at once; returns the verdict, or the refusal to record it."""
        outcome = self.command(SubmitJob(job_id=job_id, spec=spec))
        if isinstance(outcome, Refused):
            return outcome
        verdict = outcome.answer
        assert isinstance(verdict, JobAdmitted | JobRejected)
        if spec.duration_s is not None and isinstance(verdict, JobAdmitted):
            cp = spec.checkpoint
            self.work[job_id] = Work(
                duration=spec.duration_s,
                every=cp.every_s if cp else None,
                restore=cp.restore_s if cp else 0.0,
            )
        return verdict

    def cancel(self, job_id: str) -> Outcome:
        return self.command(CancelJob(job_id=job_id))

    def pause(self, job_id: str) -> Outcome:
        return self.command(PauseJob(job_id=job_id))

    def resume(self, job_id: str) -> Outcome:
        return self.command(ResumeJob(job_id=job_id))

    # -- what executors report ---------------------------------------------------------------------

    def complete(self, job_id: str) -> None:
        job = self.state.jobs.get(job_id)
        if job is not None and job.phase in ("starting", "running", "stopping"):
            self.record(
                JobCompleted(
                    id=ids.completed(job_id, job.attempt),
                    time=self.now,
                    actor=EXECUTOR,
                    job_id=job_id,
                    attempt=job.attempt,
                )
            )
            self.work.pop(job_id, None)

    def fail(self, job_id: str) -> None:
        job = self.state.jobs.get(job_id)
        if job is not None and job.phase in ("starting", "running", "stopping"):
            self.record(
                JobFailed(
                    id=ids.failed(job_id, job.attempt),
                    time=self.now,
                    actor=EXECUTOR,
                    job_id=job_id,
                    attempt=job.attempt,
                    exit_code=1,
                )
            )
            self.work.pop(job_id, None)

    # -- running ---------------------------------------------------------------------------------

    def settle(self) -> int:
        """Run cycles (and the executors' answers) until nothing more happens now.
        Returns how many decisions were made."""
        made = 0
        for _ in range(MAX_ROUNDS):
            decisions = self.cycle()
            if not decisions:
                return made
            made += len(decisions)
        raise NotSettled(f"the policy did not settle after {MAX_ROUNDS} cycles at t={self.now}")

    def cycle(self) -> list[Event]:
        """One scheduling cycle now, and the executors' answers to it. Returns the decisions."""
        decisions = decide(self.state, self.now).events
        for event in decisions:
            if self.record(event).applied:
                self._execute(event)
        return decisions

    def advance(self, seconds: float) -> None:
        """Move the clock on, settling at every moment something becomes due on the way."""
        self.run_until(self.now + seconds)

    def run_until(self, end: float, *, cycles: bool = True) -> None:
        """Move the clock to `end`, settling at every moment something becomes due on the way.
        With `cycles=False` the executors still finish and checkpoint work on time, but no cycle
        runs: the caller settles when it chooses (a simulator's round boundaries)."""
        if cycles:
            self.settle()
        while True:
            wakeup = self._next_wakeup()
            work = self._next_work_event()
            due = min((t for t in (wakeup, work) if t is not None), default=None)
            if due is None or due > end:
                break
            self.now = max(self.now, due)
            finished = self._fire_due()
            if cycles and (finished or due == wakeup or self.settle_on_checkpoint):
                self.settle()
        self.now = max(self.now, end)

    def next_due(self) -> float | None:
        times = [t for t in (self._next_wakeup(), self._next_work_event()) if t is not None]
        return min(times) if times else None

    def _next_wakeup(self) -> float | None:
        # rule 11: a pool with a usage half-life has shares that move with time alone
        timers = self._timers or bool(self.state.usage)
        return next_wakeup(self.state, self.now) if timers else None

    # -- simulated executors ---------------------------------------------------------------------

    def _execute(self, event: Event) -> None:
        if isinstance(event, JobScheduled) and not event.scale_up:
            job = self.state.jobs[event.job_id]
            self.record(started(event, self.now))
            work = self.work.get(job.id)
            if work is not None:
                work.start(self.now, resumed=event.attempt > 1)
                self._anchored(job, work)
        elif isinstance(event, JobPreemptionRequested):
            job = self.state.jobs[event.job_id]
            whole = event.replicas == 0 or event.replicas >= len(job.held)
            work = self.work.get(job.id)
            checkpointed = whole and work is not None and work.stop(self.now)
            self.record(preempted(event, self.now, checkpointed))

    def _anchored(self, job: Job, work: Work) -> None:
        """The attempt's progress was (re-)anchored: file when it finishes and next saves."""
        for kind, t in (("finish", work.finishes_at()), ("checkpoint", work.next_checkpoint_at())):
            if t is not None:
                heapq.heappush(self._due, (t, job.seq, kind, job.id))

    def _current(self, item: Due) -> bool:
        """Is this heap entry still what the job's work says (a running attempt, same time)?"""
        t, _, kind, job_id = item
        work = self.work.get(job_id)
        job = self.state.jobs.get(job_id)
        if work is None or job is None or job.phase != "running":
            return False
        return t == (work.finishes_at() if kind == "finish" else work.next_checkpoint_at())

    def _next_work_event(self) -> float | None:
        due = self._due
        while due and not self._current(due[0]):
            heapq.heappop(due)
        return due[0][0] if due else None

    def _fire_due(self) -> bool:
        """Finish or checkpoint every running job due by now (a finish wins over a checkpoint
        of the same job), in (time, submission) order. Returns whether any job finished."""
        chosen: dict[str, Due] = {}
        while self._due and self._due[0][0] <= self.now:
            item = heapq.heappop(self._due)
            if self._current(item) and (item[2] == "finish" or item[3] not in chosen):
                chosen[item[3]] = item
        finished = False
        for _, _, kind, job_id in sorted(chosen.values()):
            if kind == "finish":
                self.complete(job_id)
                finished = True
            else:
                self._checkpoint(self.state.jobs[job_id])
        return finished

    def _checkpoint(self, job: Job) -> None:
        work = self.work[job.id]
        assert work.every is not None and work.run_from is not None
        done = work.progress(self.now)
        # the step due now is reached even where float subtraction comes out a hair short
        # (run_from + every - run_from < every): else the same checkpoint fires forever
        due = (int(work.saved / work.every) + 1) * work.every
        kept = max(int(done / work.every) * work.every, due)
        # progress continues from the checkpoint; re-anchor so later maths stays exact
        work.run_from = self.now - (done - kept)
        work.saved = kept
        self._anchored(job, work)
        self.record(
            JobCheckpointed(
                id=ids.checkpointed(job.id, job.attempt, int(kept)),
                time=self.now,
                actor=EXECUTOR,
                job_id=job.id,
                attempt=job.attempt,
                save_s=job.save_s,
            )
        )
