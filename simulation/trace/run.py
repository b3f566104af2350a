"""Driving the virtual cluster through a workload: arrivals, rounds, and cycles.

Jobs are submitted at their arrival times, all jobs of one timestamp together. The simulated
executors finish and checkpoint work at the exact moment it falls due. When the scheduler runs
a cycle (`policy.cycle.decide`, until it settles) depends on `cycles`:

- `event` (default): at every arrival and every finish, as the scheduler service does (it cycles
  on every change to the log). Checkpoints are recorded when due but run no cycle of their own
  unless `cycle_on_checkpoint`: a checkpoint frees and queues nothing, it changes only what
  cost-aware victim choice weighs, so with `victim_order: newest` skipping those cycles changes
  no decision, and with `cost` it rarely does.
- `round`: one cycle at the end of each round (`round_s`) in which something arrived or
  finished, as the Tiresias, Themis and Muri simulators do: work that arrives, or GPUs that
  free up, wait for the round boundary. A cycle that preempts is followed at once by the next,
  which starts the jobs the victims made room for; a round whose cycle decided anything is
  followed by a cycle at the next boundary too. Much cheaper on long traces: a cycle costs
  O(live jobs), and there are far fewer of them.

The baselines whose priorities move (srtf, srsf, las) get their new priorities at every round
boundary, as `JobPriorityChanged` events, followed by a cycle if any priority changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from events import (
    CheckpointModel,
    JobNominated,
    JobPriorityChanged,
    JobSpec,
    ProjectTerms,
    SchedulerSettings,
)
from events.commands import ConfigureCluster, SetPool
from events.model import VictimOrder
from policy.pools import could_hold
from policy.state import FINAL_PHASES
from simulation.trace.cluster import ClusterSpec
from simulation.trace.errors import SimulationError
from simulation.trace.metrics import Recorder, Series, Summary
from simulation.trace.policies import Policy
from simulation.trace.traces import TraceJob
from simulation.trace.workload import SimJob, Workload, build_workload
from simulation.virtual_cluster import MAX_ROUNDS, NotSettled, VirtualCluster

ACTOR = "simulator"
CycleMode = Literal["event", "round"]
#: Save every 30 minutes of work, 20 s to save, 40 s to restore.
DEFAULT_CHECKPOINT = CheckpointModel(every_s=1800.0, save_s=20.0, restore_s=40.0)
#: (jobs finished or rejected, jobs in the workload): called as the run goes on.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Options:
    policy: Policy
    victim_order: VictimOrder = "newest"
    checkpoint: CheckpointModel | None = DEFAULT_CHECKPOINT
    round_s: float = 360.0
    cycles: CycleMode = "event"
    #: Event cycles only: also cycle when a checkpoint is saved (see VirtualCluster).
    cycle_on_checkpoint: bool = False
    #: Rule 11: the usage half-life (seconds) and k of the run's scheduler (None: off)
    usage_half_life_s: float | None = None
    usage_k: float = 1.0


@dataclass
class Outcome:
    workload: Workload
    summary: Summary
    series: Series
    jct_s: list[float]
    wall_s: float
    cpu_s: float  # the process's CPU time: what the run costs on a busy machine


class Simulation:
    def __init__(
        self,
        jobs: list[TraceJob],
        cluster: ClusterSpec,
        options: Options,
        quotas: Path | None = None,
        keep_log: bool = False,
    ) -> None:
        if options.round_s <= 0:
            raise SimulationError(f"--round must be positive, got {options.round_s}s")
        self.options = options
        self.policy = options.policy
        vc = self.vc = VirtualCluster(
            keep_log=keep_log, settle_on_checkpoint=options.cycle_on_checkpoint
        )
        pool = cluster.compute_pool
        vc.command(
            ConfigureCluster(
                actor=ACTOR,
                scheduler=SchedulerSettings(
                    type=self.policy.scheduler,
                    fitting=cluster.fitting,
                    victim_order=options.victim_order,
                    usage_half_life_s=options.usage_half_life_s,
                    usage_k=options.usage_k,
                ),
                default_compute_pool=pool,
            )
        )
        for entry in cluster.pools:
            vc.command(SetPool(pool=entry.name, actor=ACTOR))
            for node in entry.nodes:
                vc.add_node(node.name, entry.name, node.gpus)

        def fits(job: SimJob) -> bool:
            return could_hold(vc.state, pool, job.gpus, job.replicas, None)

        self.workload = build_workload(jobs, cluster, fits, quotas)
        for project, terms in self.workload.projects.items():
            vc.set_project(project, terms)
        compute_terms = {p: t.get(pool, ProjectTerms()) for p, t in self.workload.projects.items()}
        self._event_cycles = options.cycles == "event"
        self.recorder = Recorder(
            cluster.gpus,
            compute_terms,
            track_touched=self.policy.rank is not None,
            eager_fair_share=self._event_cycles,
        )
        vc.observer = self.recorder.observe
        self.by_id = {j.job_id: j for j in self.workload.jobs}
        # Boundaries matter to round mode and to the baselines whose priorities move.
        self._rounds = not self._event_cycles or self.policy.rank is not None
        self._round_no = 0
        self._boundary = options.round_s
        self._next = 0  # index of the next job to arrive
        self._dirty = False  # round mode: something arrived or finished since the last cycle

    # -- the run -------------------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> Outcome:
        started, cpu = time.perf_counter(), time.process_time()
        jobs, vc, total = self.workload.jobs, self.vc, len(self.workload.jobs)
        while self._next < total:
            now = jobs[self._next].submit_s
            self._advance_to(now, boundary_too=False)
            while self._next < total and jobs[self._next].submit_s == now:
                self._submit(jobs[self._next])
                self._next += 1
            self._dirty = not self._event_cycles
            if progress is not None:
                progress(self.recorder.finished, total)
        if self._event_cycles:
            vc.settle()
        while vc.state.live:
            due = vc.next_due()
            if due is None and not self._dirty:
                break  # nothing can move any more (reported as jobs not completed)
            if self._rounds:
                self._advance_to(self._boundary, boundary_too=True)
            elif due is not None:
                self._advance_to(due, boundary_too=True)
            if progress is not None:
                progress(self.recorder.finished, total)
        self.recorder.close()
        return Outcome(
            workload=self.workload,
            summary=self.recorder.summary(),
            series=self.recorder.series,
            jct_s=self.recorder.jct_s(),
            wall_s=time.perf_counter() - started,
            cpu_s=time.process_time() - cpu,
        )

    def _submit(self, job: SimJob) -> None:
        spec = JobSpec(
            project=job.project,
            priority=self.policy.initial_priority(job),
            preemptible=self.policy.preemptible,
            gpus=job.gpus,
            replicas=job.replicas,
            duration_s=job.duration_s,
            checkpoint=self.options.checkpoint,
        )
        self.vc.submit(job.job_id, spec)

    def _advance_to(self, t: float, boundary_too: bool) -> None:
        """Move the clock to `t`, stopping at each round boundary before it (and at `t` itself
        if `boundary_too`: arrivals at a boundary are in time for it)."""
        while self._rounds and (self._boundary < t or (boundary_too and self._boundary == t)):
            self._at_boundary()
        self._run_until(t)

    def _run_until(self, t: float) -> None:
        finished = self.recorder.finished
        self.vc.run_until(t, cycles=self._event_cycles)
        if self.recorder.finished != finished and not self._event_cycles:
            self._dirty = True

    def _at_boundary(self) -> None:
        b = self._boundary
        self._run_until(b)
        self._round_no += 1
        changed = self.policy.rank is not None and self._reprioritize()
        if self._event_cycles:
            if changed:
                self.vc.settle()
        else:
            self.recorder.fair.refresh(b)
            if changed or self._dirty:
                # a cycle that decided something may leave work for one more (a job it placed
                # can be a victim now): the next round looks again even if nothing happens
                self._dirty = self._round_cycle()
        self._boundary = b + self.options.round_s
        if not self.vc.state.live and self._next < len(self.workload.jobs):
            # an empty cluster has nothing to do until the next arrival
            arrival = self.workload.jobs[self._next].submit_s
            rounds = math.ceil(arrival / self.options.round_s)
            self._boundary = max(self._boundary, rounds * self.options.round_s)

    def _round_cycle(self) -> bool:
        """The round's cycle, followed by more only while the last one asked victims to stop:
        on a live cluster the job they make room for starts as soon as they have stopped, not a
        round later. Anything else left undone waits for the next round. Returns whether any
        decision was made."""
        made = False
        for _ in range(MAX_ROUNDS):
            decisions = self.vc.cycle()
            made = made or bool(decisions)
            if not any(isinstance(e, JobNominated) for e in decisions):
                return made
        raise NotSettled(f"preemptions went on for {MAX_ROUNDS} cycles at t={self.vc.now}")

    def _reprioritize(self) -> bool:
        """Record the new priority of every job whose rank may have moved since the last
        boundary (those that held GPUs meanwhile). Returns whether any priority changed."""
        assert self.policy.rank is not None
        vc, now, changed = self.vc, self.vc.now, False
        touched = [vc.state.jobs[j] for j in self.recorder.drain_touched()]
        for job in sorted(touched, key=lambda j: j.seq):
            if job.phase in FINAL_PHASES:
                continue
            work = vc.work.get(job.id)
            sim = self.by_id[job.id]
            done = work.progress(now) if work is not None else sim.duration_s
            attained = self.recorder.jobs[job.id].attained_gpu_s(now)
            priority = self.policy.rank(sim, done, attained)
            if priority != job.priority:
                vc.record(
                    JobPriorityChanged(
                        id=f"{job.id}/priority/{self._round_no}",
                        time=now,
                        actor=ACTOR,
                        job_id=job.id,
                        priority=priority,
                    )
                )
                changed = True
        return changed
