"""An independent ledger of GPU holdings, built from the raw log without the policy's fold.

The fold referees decisions (a placement on GPUs already taken has no effect), so checking a
run with the fold would hide the very double takes a crash could cause. This reads what the
executors reported instead: a replica holds its GPUs from its attempt's `JobStarted` until that
attempt's `JobCompleted`, `JobFailed` or `JobPreempted` (GPUs from the attempt's first
placement), and no GPU may be held by two attempts at once. It also counts each job's
`JobCompleted` events (a job completes once, whatever its attempts).

The crash tests and the compose test check their runs with it, and so does the hollow
cluster benchmark (bench/hollow_cluster.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events import JobCompleted, JobFailed, JobPreempted, JobScheduled, JobStarted
from services.runtime.eventlog import Stored

Gpu = tuple[str, int]
Attempt = tuple[str, int]


@dataclass
class Holdings:
    placed: dict[Attempt, list[Gpu]] = field(default_factory=dict)
    holder: dict[Gpu, Attempt] = field(default_factory=dict)
    running: set[Attempt] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    started: int = 0
    #: `JobCompleted` events per job
    completed: dict[str, int] = field(default_factory=dict)

    def apply(self, stored: Stored) -> None:
        e = stored.event
        if isinstance(e, JobScheduled):
            attempt = (e.job_id, e.attempt)
            # asked before `setdefault` adds the key (asked inside its call's argument, it
            # was always there, and no GPU was ever recorded)
            if attempt not in self.placed or e.scale_up:
                gpus = [(r.node, g) for r in e.replicas for g in r.gpus]
                self.placed.setdefault(attempt, []).extend(gpus)
        elif isinstance(e, JobStarted):
            attempt = (e.job_id, e.attempt)
            if attempt in self.running:
                self.problems.append(f"seq {stored.seq}: {attempt} started twice")
                return
            self.running.add(attempt)
            self.started += 1
            for gpu in self.placed.get(attempt, []):
                other = self.holder.setdefault(gpu, attempt)
                if other != attempt:
                    self.problems.append(
                        f"seq {stored.seq}: GPU {gpu} held by {other} and {attempt}"
                    )
        elif isinstance(e, JobCompleted | JobFailed | JobPreempted):
            if isinstance(e, JobCompleted):
                self.completed[e.job_id] = self.completed.get(e.job_id, 0) + 1
            attempt = (e.job_id, e.attempt)
            self.running.discard(attempt)
            for gpu in self.placed.get(attempt, []):
                if self.holder.get(gpu) == attempt:
                    del self.holder[gpu]


def check_holdings(stored: list[Stored]) -> Holdings:
    holdings = Holdings()
    for s in stored:
        holdings.apply(s)
    return holdings
