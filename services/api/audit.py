"""The audit through the API: the policy re-derives the decisions on the log (policy/audit.py).

The whole log up to the last decision asked about is folded (a decision's state depends on
everything before it), so the API audits logs up to `MAX_EVENTS` long and says to use
`fairlane audit` beyond that. The work is CPU-bound: it runs in a worker thread, one audit at a
time (the caller's semaphore), so the API keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from events import Event
from policy.audit import DECISIONS, Outcome, Scope, as_document, audit
from services.runtime.eventlog import JetStreamLog

#: The longest log the API audits (about a day of a busy 64-node cluster).
MAX_EVENTS: Final = 200_000


class TooLong(Exception):
    pass


async def _log_until(log: JetStreamLog, last: int | None) -> list[tuple[int, Event]]:
    end = await log.last_seq()
    if last is not None:
        end = min(end, last)
    if end > MAX_EVENTS:
        raise TooLong(
            f"the log up to position {end} is longer than the API audits ({MAX_EVENTS:,}"
            " events): use `fairlane audit`, which reads the log or an export of it"
        )
    events: list[tuple[int, Event]] = []
    async for stored in log.read(1):
        if stored.seq > end:
            break
        events.append((stored.seq, stored.event))
    return events


async def audit_log(
    log: JetStreamLog, one_at_a_time: asyncio.Semaphore, scope: Scope
) -> dict[str, Any]:
    """The audit report of the decisions in `scope`, as `fairlane audit -o json` prints it."""
    async with one_at_a_time:
        events = await _log_until(log, scope.last)
        report = await asyncio.to_thread(audit, events, scope)
    return as_document(report)


async def outcomes_for_job(
    log: JetStreamLog, one_at_a_time: asyncio.Semaphore, job_id: str
) -> dict[int, Outcome]:
    """Each decision about `job_id` (by log position): what re-deriving it found."""
    async with one_at_a_time:
        events = await _log_until(log, None)
        scope = Scope(job=job_id)
        report = await asyncio.to_thread(audit, events, scope)
    # the report names what is not a plain match; every other decision in scope matched
    outcomes: dict[int, Outcome] = {
        seq: "matches"
        for seq, event in events
        if isinstance(event, DECISIONS) and scope.covers(seq, event)
    }
    outcomes.update((f.seq, f.outcome) for f in report.findings)
    return outcomes
