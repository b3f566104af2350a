"""History: each project's GPUs in use against its quota and fair share over time, and each
pool's GPUs allocated, made again from the timeline read model (no store of its own).

The timeline keeps every event as stored. Folding them in order with the projection's own
fold (`projections.Projection`) and reading the state at evenly spaced times gives, at each
time, what `project_pools` and `nodes` said then; the fair share is the policy's own
`fair_shares` on that state, as the projector computes it. `history` is pure; the route reads
the events and runs it in a worker thread, one at a time (it folds the whole log).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from events import Event
from policy.cycle import fair_shares
from projections.projection import Projection

#: The most points a series may have (the page draws about 60).
POINTS_MAX = 500


class ProjectPoint(msgspec.Struct):
    """A project's GPUs in use, quota and fair share in one pool at a time."""

    time: float
    usage: int
    quota: int
    fair_share: int


class ProjectSeries(msgspec.Struct):
    project: str
    pool: str
    points: list[ProjectPoint]


class PoolPoint(msgspec.Struct):
    """A pool's GPUs (on nodes not lost) and those allocated, at a time."""

    time: float
    gpus: int
    allocated: int


class PoolSeries(msgspec.Struct):
    pool: str
    points: list[PoolPoint]


class History(msgspec.Struct):
    since: float
    until: float
    step_s: float
    pools: list[PoolSeries]
    projects: list[ProjectSeries]


def times(since: float, until: float, points: int) -> list[float]:
    """`points` evenly spaced times from `since` to `until`, both included."""
    if points <= 1 or until <= since:
        return [until]
    step = (until - since) / (points - 1)
    return [since + i * step for i in range(points)]


def _pools_now(p: Projection) -> dict[str, tuple[int, int]]:
    """pool -> (GPUs, allocated) on the nodes not lost."""
    state = p.state
    found: dict[str, tuple[int, int]] = {}
    for name, node in state.nodes.items():
        busy = len(set(state.owners.get(name, {})) | set(state.reserved.get(name, {})))
        gpus, allocated = found.get(node.pool, (0, 0))
        found[node.pool] = (gpus + node.gpus, allocated + min(busy, node.gpus))
    return found


def _projects_now(p: Projection, at: float) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(project, pool) -> (in use, quota, fair share) for every project and pool it has had
    terms, usage or a share in."""
    shares = fair_shares(p.state, at)
    named = set(p.state.projects) | {j.project for j in p.state.live.values() if j.project}
    named |= {project for pool in shares.values() for project in pool}
    found: dict[tuple[str, str], tuple[int, int, int]] = {}
    for project in sorted(named):
        pools = set(p.pools_of(project)) | {pool for pool, s in shares.items() if project in s}
        for pool in sorted(pools):
            row = p.project_pool_row((project, pool))
            share = shares.get(pool, {}).get(project, 0)
            found[(project, pool)] = (row.usage, row.quota, share)
    return found


def history(
    events: Iterable[tuple[int, Event]], at: list[float], shows: set[str] | None
) -> History:
    """Fold `events` (in log order) and read the state at each time of `at` (ascending).
    `shows`: the projects whose series are given (None: all)."""
    p = Projection()
    pools: dict[str, list[PoolPoint]] = {}
    projects: dict[tuple[str, str], list[ProjectPoint]] = {}
    pending = iter(at)
    next_time = next(pending, None)

    def record(t: float) -> None:
        for pool, (gpus, allocated) in _pools_now(p).items():
            pools.setdefault(pool, []).append(PoolPoint(t, gpus, allocated))
        for key, (usage, quota, share) in _projects_now(p, t).items():
            # a series starts once there is something to draw, and then goes on at 0
            if (shows is None or key[0] in shows) and (usage or quota or share or key in projects):
                projects.setdefault(key, []).append(ProjectPoint(t, usage, quota, share))

    for seq, event in events:
        while next_time is not None and event.time > next_time:
            record(next_time)
            next_time = next(pending, None)
        p.apply(seq, event)
        p.discard()  # no rows are wanted: only the state at the chosen times
    while next_time is not None:
        record(next_time)
        next_time = next(pending, None)
    step = at[1] - at[0] if len(at) > 1 else 0.0
    return History(
        since=at[0] if at else 0.0,
        until=at[-1] if at else 0.0,
        step_s=step,
        pools=[PoolSeries(pool, points) for pool, points in sorted(pools.items())],
        projects=[
            ProjectSeries(project, pool, points)
            for (project, pool), points in sorted(projects.items())
        ],
    )
