"""Cluster state as a left fold over the event log.

`ClusterState.apply(event)` is the only way state changes, so every service that replays the same
log holds the same state. Objects are mutable for speed (a 15,000-job cycle must stay in
milliseconds); `clone()` gives an independent copy for what-if questions.

The state's data, queries and the moves on it are `ClusterData` (policy/cluster_data.py), its
records are in policy/records.py, and the handlers for each event type in the `fold_*` modules;
this module joins them, and is where everyone else imports them from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled
from policy import decision_ids, fold_attempts, fold_cluster, fold_placement
from policy.cluster_data import ClusterData, Handler
from policy.records import (
    FINAL_PHASES,
    HOLDING_PHASES,
    Job,
    JobPhase,
    Node,
    Pool,
    Project,
)

__all__ = [
    "APPLIED",
    "FINAL_PHASES",
    "HOLDING_PHASES",
    "ClusterState",
    "Job",
    "JobPhase",
    "Node",
    "Pool",
    "Project",
    "Verdict",
]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the fold did with one event: applied, or refused and why (a decision made on a
    state the log has moved past, an event about a job or node it does not know, ...)."""

    applied: bool
    reason: str = ""


APPLIED: Final = Verdict(True)

#: Each event type's handler (the modules handle disjoint types); an event of a type not
#: here changes nothing but the log position.
_HANDLERS: Final[dict[type[Event], Handler]] = {
    **fold_cluster.HANDLERS,
    **fold_placement.HANDLERS,
    **fold_attempts.HANDLERS,
}


#: The decisions whose refusal the fold counts (`Job.refusals`).
_COUNTED_REFUSALS: Final = (JobScheduled, JobNominated, JobPreemptionRequested)


@dataclass(slots=True)
class ClusterState(ClusterData):
    """The cluster's data (`ClusterData`) and the fold that changes it."""

    def apply(self, event: Event, seq: int | None = None) -> Verdict:
        """Apply one event at log position `seq`, and say whether it took effect. Events about
        unknown jobs or nodes, and decisions the log has moved past, change nothing."""
        self.events_applied += 1
        self.position = self.events_applied if seq is None else seq
        self.last_time = max(self.last_time, event.time)
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return APPLIED
        refused = handler(self, event)
        if refused is None:
            return APPLIED
        if isinstance(event, _COUNTED_REFUSALS):
            self._count_refusal(event)
        return Verdict(False, refused)

    def _count_refusal(self, event: JobScheduled | JobNominated | JobPreemptionRequested) -> None:
        """A decision refused (decided on a view the log has moved past) that the policy would
        make again under the same id: counted, so that the next one gets a fresh id
        (`policy.decision_ids`). Once: counted, its id is no longer the next one's."""
        job = self.jobs.get(event.job_id)
        if job is not None and decision_ids.made_again(job, event):
            job.refusals += 1

    def apply_all(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)
