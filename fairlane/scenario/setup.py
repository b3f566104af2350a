"""A scenario's configuration as the commands a user would send: the same for both engines."""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from events import ProjectTerms
from events.commands import CancelJob, PauseJob, ResumeJob, SetPool, SetProject
from fairlane.scenario.spec import ProjectEntry, Scenario

#: The steps that are a user's command about a job, and the command each one sends.
JOB_COMMANDS: Final[dict[str, type[CancelJob | PauseJob | ResumeJob]]] = {
    "cancel": CancelJob,
    "pause": PauseJob,
    "resume": ResumeJob,
}


def compute_pool_of(scenario: Scenario) -> str:
    compute_pool = scenario.config.default_compute_pool
    assert compute_pool is not None  # the parser fills it in
    return compute_pool


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


def project_terms(
    entry: ProjectEntry, pools: list[str], compute_pool: str
) -> dict[str, ProjectTerms]:
    """A project's terms per pool. A bare quota or limit is for the default compute pool;
    a bare weight or priority applies in every pool."""

    def pick(values: dict[str | None, int] | None, pool: str, everywhere: bool) -> int | None:
        if values is None:
            return None
        if pool in values:
            return values[pool]
        if None in values and (everywhere or pool == compute_pool):
            return values[None]
        return None

    terms: dict[str, ProjectTerms] = {}
    for pool in pools:
        weight = pick(entry.over_quota_weight, pool, everywhere=True)
        priority = pick(entry.priority, pool, everywhere=True)
        terms[pool] = ProjectTerms(
            quota=pick(entry.quota, pool, everywhere=False) or 0,
            over_quota_weight=1 if weight is None else weight,
            limit=pick(entry.limit, pool, everywhere=False),
            priority=100 if priority is None else priority,
        )
    return terms


def _merge(old: ProjectEntry, new: ProjectEntry) -> ProjectEntry:
    """set_project: fields not given keep their values."""
    changes = {k: getattr(new, k) for k in ("quota", "limit", "over_quota_weight", "priority")}
    return replace(old, **{k: v for k, v in changes.items() if v is not None})
