"""Read models: pure code that turns the event log (and the fold's view of it) into rows.

`Projection` folds events one at a time and collects the rows they change; a writer (the
projector service) stores each batch of rows with the last stream sequence they came from.
Nothing here does I/O: the same code projects a live log, a rebuild and a test's list of events.
"""

from projections.projection import Batch, Projection
from projections.rows import (
    JobRow,
    NodeRow,
    OverQuotaRow,
    PreemptionRow,
    ProjectPoolRow,
    TimelineRow,
)

__all__ = [
    "Batch",
    "JobRow",
    "NodeRow",
    "OverQuotaRow",
    "PreemptionRow",
    "ProjectPoolRow",
    "Projection",
    "TimelineRow",
]
