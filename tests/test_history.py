"""The usage history (`services/api/history.py`, pure) on histories recorded from the live
engine (tests/histories/): at every time it gives what the read models said then. At the
end of a log, the projection's own rows (usage, quota, fair share, GPUs allocated); before
the first placement, nothing in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import JobScheduled
from projections.projection import Projection
from services.api.history import history, times
from tests.test_audit import HISTORIES, load


def test_times_are_evenly_spaced_and_bounded() -> None:
    assert times(10.0, 20.0, 3) == [10.0, 15.0, 20.0]
    assert times(10.0, 10.0, 5) == [10.0]


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
def test_the_last_point_is_what_the_read_models_say(path: Path) -> None:
    events = load(path)
    end = events[-1][1].time
    first_placed = next(e.time for _, e in events if isinstance(e, JobScheduled))
    before = (events[0][1].time + first_placed) / 2
    found = history(events, [before, end], None)

    projection = Projection()
    for seq, event in events:
        projection.apply(seq, event)
    batch = projection.take()
    rows = {(r.project, r.pool): r for r in batch.project_pools}
    for series in found.projects:
        last = series.points[-1]
        row = rows[(series.project, series.pool)]
        assert (last.usage, last.quota, last.fair_share) == (row.usage, row.quota, row.fair_share)
    assert {(s.project, s.pool) for s in found.projects} == {
        key for key, r in rows.items() if r.usage or r.quota or r.fair_share
    }
    nodes = [projection.node_row(n) for n in projection.state.nodes]
    (pool,) = found.pools
    assert pool.points[-1].gpus == sum(n.gpus for n in nodes)
    assert pool.points[-1].allocated == sum(n.gpus - n.free for n in nodes)
    # before anything was placed, nothing was in use or allocated
    assert pool.points[0].allocated == 0
    assert all(s.points[0].usage == 0 for s in found.projects if len(s.points) == 2)
    # a token's projects only (the pools are everyone's)
    shown = history(events, [end], {"nobody"})
    assert shown.projects == [] and [p.points[-1] for p in shown.pools] == [pool.points[-1]]
