"""One entry for every command: which decider answers it."""

from __future__ import annotations

from events.commands import (
    AnyCommand,
    CancelJob,
    ConfigureCluster,
    HoldScheduling,
    PauseJob,
    ResumeJob,
    SetPool,
    SetProject,
    SubmitJob,
)
from policy.commands import config, jobs
from policy.commands.outcome import Outcome
from policy.state import ClusterState


def decide_command(state: ClusterState, command: AnyCommand, now: float, at: int) -> Outcome:
    """The events `command` leads to, or why it is refused. Pure: `now` is the time to stamp
    and `at` the log position `state` is folded up to (it makes repeatable commands' ids)."""
    match command:
        case SubmitJob():
            return jobs.submit(state, command, now)
        case CancelJob():
            return jobs.cancel(state, command, now)
        case PauseJob():
            return jobs.pause(state, command, now, at)
        case ResumeJob():
            return jobs.resume(state, command, now, at)
        case SetProject():
            return config.set_project(state, command, now, at)
        case SetPool():
            return config.set_pool(command, now, at)
        case ConfigureCluster():
            return config.configure_cluster(command, now, at)
        case HoldScheduling():
            return config.hold(command, now, at)
