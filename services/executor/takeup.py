"""Taking up what an earlier run of this executor left on the node: the workloads it recorded
(or the runtime finds by their labels) are adopted, replicas the log runs here with nothing
found are ended with no status (lost, or stopped by the last shut down, whose file names
them); the planner does the rest (starts what was placed while the executor was down, reports
what ended, stops what the log no longer wants)."""

from __future__ import annotations

from events.model import Replica
from services.executor.facts import AttemptKey, ReplicaKey
from services.executor.inventory import Inventory, attempt_of
from services.executor.launch import launch_of
from services.executor.nodework import NodeWork
from services.executor.runtime import ProcessRecord, Workload
from services.executor.shutdown import read_stopped
from services.executor.starting import Starting


class TakingUp:
    def __init__(self, inventory: Inventory, starting: Starting) -> None:
        self.inventory, self.starting = inventory, starting
        self.logger = inventory.logger

    def take_up(self, work: NodeWork, found: list[ProcessRecord]) -> dict[AttemptKey, float]:
        """Adopt and record what is here; the attempts the last shut down stopped, and when."""
        runtime = self.inventory.runtime
        recorded = {(r.job_id, r.attempt, Replica(r.node, r.gpus)): r for r in found}
        marks = read_stopped(self.inventory.data_dir) if runtime.real else {}
        shut: dict[AttemptKey, float] = {}
        for job in list(work.jobs.values()):
            orders = work.stops_of(job.job_id)
            mark = marks.get((job.job_id, job.attempt))
            if mark is not None and all(o.reason == "shutdown" for o in orders):
                shut[(job.job_id, job.attempt)] = mark.at
            self._job(work, job.job_id, recorded, mark is not None)
        for key, record in recorded.items():  # not wanted by the log any more: stopped
            self.inventory.attempt(attempt_of(key), record.replica, False, None)
            self._adopt(key, record.replica, runtime.adopt(record), record.token)
        self.inventory.save_records()
        return shut

    def _job(
        self, work: NodeWork, job_id: str, recorded: dict[ReplicaKey, ProcessRecord], shut: bool
    ) -> None:
        inventory, job = self.inventory, work.jobs[job_id]
        here = [(i, r) for i, r in enumerate(job.held) if r.node == inventory.node]
        if (
            job.phase == "starting"
            and not shut
            and not any((job_id, job.attempt, r) in recorded for _, r in here)
        ):
            return  # placed while the executor was down: the planner starts it
        announce = job.held[0].node == inventory.node and job.phase == "starting" and not shut
        key = (job_id, job.attempt)
        inventory.attempt(key, here[0][0], announce, work.scheduled.get(job_id))
        n, last = work.checkpoints_of(job_id, job.attempt)
        inventory.set_attempt(key, checkpoints=n, last_checkpoint=last)
        for index, replica in here:
            rkey = (job_id, job.attempt, replica)
            record = recorded.pop(rkey, None)
            if record is not None:
                inventory.set_attempt(key, baseline=record.checkpoint_mtime)
                workload = inventory.runtime.adopt(record)
                self._adopt(rkey, index, workload, record.token)
                self.logger.info("adopted", job=job_id, replica=index, alive=workload.alive())
                continue
            launch = launch_of(job, index, replica, self.starting.site)
            if (unrecorded := inventory.runtime.adopt_unrecorded(launch)) is not None:
                self._adopt(rkey, index, unrecorded, "")
            elif shut or job.phase != "starting":
                if not shut:
                    self.logger.warning(
                        "no record of a replica the log runs here: lost", job=job_id
                    )
                inventory.add(rkey, index, launched=True, ended=True)
            # else: placed while the executor was down, never started: the planner starts it

    def _adopt(self, key: ReplicaKey, index: int, workload: Workload, token: str) -> None:
        handle = self.inventory.add(key, index)
        handle.workload, handle.token = workload, token
        self.inventory.spawn(self.starting.run(key, handle, None))
