"""A job or a project as it stood at a log position, made again from its own timeline.

The timeline keeps, for every event, whether the fold applied it. A job's applied events alone,
folded in order on nodes just large enough for the GPUs they name, give the job's state,
attempt, GPUs and clocks at any position: the fold's refusals, which depended on other jobs,
are already settled by the `applied` flag. A project's applied events (its configurations,
its quota crossings and its jobs' events) give its terms and usage per pool the same way; its
fair share needs every other project's demand too, so it is not given; neither is why a job
waited (`JobRow.waiting`), which needs the whole cluster the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled, NodeRegistered
from projections.projection import Projection
from projections.rows import JobRow, ProjectPoolRow


def job_as_of(job_id: str, applied: Iterable[tuple[int, Event]]) -> JobRow | None:
    """`applied`: the job's applied events up to the position, with their sequences."""
    projection = _replayed(list(applied))
    if job_id not in projection.state.jobs:
        return None
    return projection.job_row(job_id)


def project_as_of(project: str, applied: Iterable[tuple[int, Event]]) -> list[ProjectPoolRow]:
    """`applied`: the project's applied events up to the position (its own and its jobs'), with
    their sequences. One row per pool it had terms or usage in; `fair_share` is left at 0."""
    projection = _replayed(list(applied))
    return [projection.project_pool_row((project, pool)) for pool in projection.pools_of(project)]


def _replayed(events: list[tuple[int, Event]]) -> Projection:
    """The events folded on nodes just large enough for the GPUs they name."""
    sizes: dict[str, tuple[str, int]] = {}
    for _, event in events:
        if isinstance(event, JobScheduled | JobNominated):
            for replica in event.replicas:
                _, known = sizes.get(replica.node, (event.pool, 0))
                sizes[replica.node] = (event.pool, max(known, max(replica.gpus, default=-1) + 1))
    projection = Projection()
    first = events[0][1].time if events else 0.0
    for node, (pool, gpus) in sizes.items():
        projection.apply(
            0, NodeRegistered(id=f"as-of/{node}", time=first, actor="as-of", node=node,
                              pool=pool, gpus=gpus)
        )  # fmt: skip
    for seq, event in events:
        projection.apply(seq, _alone(event))
    return projection  # never taken: no fair share is computed from one project's events


def _alone(event: Event) -> Event:
    """A stop request was applied on the log after the nomination it served (its causation, on
    another job's timeline); that job is not part of this replay, so the request stands alone."""
    if isinstance(event, JobPreemptionRequested) and event.causation is not None:
        return msgspec.structs.replace(event, causation=None)
    return event
