"""One entry for every command: which decider answers it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from events.commands import (
    AllowVolume,
    AnyCommand,
    CancelJob,
    ConfigureCluster,
    CordonNode,
    DenyVolume,
    HoldScheduling,
    PauseJob,
    ResumeJob,
    SetJobPriority,
    SetPool,
    SetProject,
    SubmitJob,
    UncordonNode,
)
from policy.commands import config, jobs, volumes
from policy.commands.outcome import Outcome
from policy.state import ClusterState

Decider = Callable[[ClusterState, Any, float, int], Outcome]

#: Every command type's decider; each takes (state, command, now, at).
DECIDERS: Final[dict[type, Decider]] = {
    SubmitJob: jobs.submit,
    CancelJob: jobs.cancel,
    PauseJob: jobs.pause,
    ResumeJob: jobs.resume,
    SetProject: config.set_project,
    SetPool: config.set_pool,
    ConfigureCluster: config.configure_cluster,
    HoldScheduling: config.hold,
    CordonNode: config.cordon_node,
    UncordonNode: config.uncordon_node,
    SetJobPriority: jobs.set_priority,
    AllowVolume: volumes.allow,
    DenyVolume: volumes.deny,
}


def decide_command(state: ClusterState, command: AnyCommand, now: float, at: int) -> Outcome:
    """The events `command` leads to, or why it is refused. Pure: `now` is the time to stamp
    and `at` the log position `state` is folded up to (it makes repeatable commands' ids)."""
    return DECIDERS[type(command)](state, command, now, at)
