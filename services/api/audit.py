"""The audit through the API: the policy re-derives the decisions on the log (policy/audit.py).

The whole log up to the last decision asked about is folded (a decision's state depends on
everything before it), so the API audits logs up to `MAX_EVENTS` long and says to use
`fairlane audit` beyond that: the bound is the time an answer takes, the memory being the fold's
alone (the audit streams the log). The work is CPU-bound: it runs in a worker thread, one audit
at a time (the caller's semaphore), reading the stream through this loop, so the API keeps
answering meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Final

from events import Event
from policy.audit import DECISIONS, Outcome, Reader, Scope, as_document, audit
from services.runtime.eventlog import EventLog
from services.runtime.log_reader import blocking_reader

#: The longest log the API audits (about a day of a busy 64-node cluster).
MAX_EVENTS: Final = 200_000


class TooLong(Exception):
    pass


async def _reader(log: EventLog, last: int | None) -> Reader:
    end = await log.last_seq()
    if last is not None:
        end = min(end, last)
    if end > MAX_EVENTS:
        raise TooLong(
            f"the log up to position {end} is longer than the API audits ({MAX_EVENTS:,}"
            " events): use `fairlane audit`, which reads the log or an export of it"
        )
    return blocking_reader(log, asyncio.get_running_loop(), end)


async def audit_log(
    log: EventLog, one_at_a_time: asyncio.Semaphore, scope: Scope
) -> dict[str, Any]:
    """The audit report of the decisions in `scope`, as `fairlane audit -o json` prints it."""
    async with one_at_a_time:
        read = await _reader(log, scope.last)
        report = await asyncio.to_thread(audit, read, scope)
    return as_document(report)


async def outcomes_for_job(
    log: EventLog, one_at_a_time: asyncio.Semaphore, job_id: str
) -> dict[int, Outcome]:
    """Each decision about `job_id` (by log position): what re-deriving it found."""
    scope = Scope(job=job_id)
    in_scope: set[int] = set()

    def noting(read: Reader) -> Reader:
        """`read`, noting the positions of the decisions in scope as they go by."""

        def tapped(first: int) -> Iterator[tuple[int, Event]]:
            for seq, event in read(first):
                if isinstance(event, DECISIONS) and scope.covers(seq, event):
                    in_scope.add(seq)
                yield seq, event

        return tapped

    async with one_at_a_time:
        read = noting(await _reader(log, None))
        report = await asyncio.to_thread(audit, read, scope)
    # the report names what is not a plain match; every other decision in scope matched
    outcomes: dict[int, Outcome] = dict.fromkeys(sorted(in_scope), "matches")
    outcomes.update((f.seq, f.outcome) for f in report.findings)
    return outcomes
