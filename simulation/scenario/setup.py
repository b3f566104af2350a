"""A scenario's configuration as the commands a user would send: the same for both engines."""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from events.commands import (
    CancelJob,
    CordonNode,
    PauseJob,
    ResumeJob,
    SetPool,
    SetProject,
    UncordonNode,
)
from simulation.spec import ProjectEntry, Scenario, project_terms


class SetupRefused(RuntimeError):
    """The scenario's configuration was refused, as the services refuse it (either engine)."""


#: The steps that are a user's command about a job, and the command each one sends.
JOB_COMMANDS: Final[dict[str, type[CancelJob | PauseJob | ResumeJob]]] = {
    "cancel": CancelJob,
    "pause": PauseJob,
    "resume": ResumeJob,
}


def node_command(kind: str, node: str) -> CordonNode | UncordonNode:
    """The operator's command a `cordon`, `drain` or `uncordon` step sends."""
    if kind == "uncordon":
        return UncordonNode(node=node)
    return CordonNode(node=node, drain=kind == "drain")


def pool_commands(scenario: Scenario) -> list[SetPool]:
    return [SetPool(pool=p.name, scheduler=p.scheduler) for p in scenario.pools]


class Projects:
    """The projects as the scenario has set them so far: `set_project` keeps what it does not
    give. Each change becomes one complete `SetProject` per pool."""

    def __init__(self, compute_pool: str) -> None:
        self.compute_pool = compute_pool
        self.entries: dict[str, ProjectEntry] = {}

    def set(self, entry: ProjectEntry, pools: list[str]) -> list[SetProject]:
        old = self.entries.get(entry.name)
        merged = _merge(old, entry) if old is not None else entry
        self.entries[entry.name] = merged
        return [
            SetProject(
                project=entry.name,
                pool=pool,
                quota=terms.quota,
                over_quota_weight=terms.over_quota_weight,
                limit=terms.limit,
                no_limit=terms.limit is None,
                priority=terms.priority,
            )
            for pool, terms in project_terms(merged, pools, self.compute_pool).items()
        ]


def _merge(old: ProjectEntry, new: ProjectEntry) -> ProjectEntry:
    """set_project: fields not given keep their values."""
    changes = {k: getattr(new, k) for k in ("quota", "limit", "over_quota_weight", "priority")}
    return replace(old, **{k: v for k, v in changes.items() if v is not None})
