"""Read models: pure code that turns the event log (and the fold's view of it) into rows.

`Projection` folds events one at a time and collects the rows they change; a writer (the
projector service) stores each batch of rows with the last stream sequence they came from.
Nothing here does I/O: the same code projects a live log, a rebuild and a test's list of events.
"""

from typing import Final

from projections.projection import Batch, Projection
from projections.rows import (
    JobRow,
    NodeRow,
    OverQuotaRow,
    PreemptionRow,
    ProjectPoolRow,
    TimelineRow,
)

#: What the same log projects to, as a number: raised with every change to the rows a log gives
#: (a column's meaning, a row that was wrong). A projector finding read models written by
#: another version rebuilds them from the log (services/projector). 2: a job never admitted
#: shows the GPUs and replicas it asked for, a rejected one its priority too.
VERSION: Final = 2

__all__ = [
    "VERSION",
    "Batch",
    "JobRow",
    "NodeRow",
    "OverQuotaRow",
    "PreemptionRow",
    "ProjectPoolRow",
    "Projection",
    "TimelineRow",
]
