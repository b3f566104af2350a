"""The audit: does every decision on the log follow from the policy?

Given the log, `audit` reads it once, in order, folding as it goes, and re-derives each
decision (a placement, a nomination, a stop request) on the fold as it stood at the decision's
`basis_seq`: the `Plan` of `decide(state, decision.time)`, and the decision of the same id in
that plan (policy/audit_replay.py). The scheduler and the preemptor each publish their share of
one plan with the plan's basis, so the decisions with one basis and one time are one plan,
re-derived once. A decision matches when it is exactly the policy's, every field: basis, actor
(the preemptor's decisions carry its own), time, replicas, victims, reason and facts
(policy/audit_judge.py). Each decision's verdict from the fold (applied, or refused and why) is
reported too.

Memory is the fold plus a bounded window of events, never the log: the log is read again only
for a decision published long after its basis (re-derived on a fold made again up to there),
and to leave out of what the policy gives instead of a decision the decisions that are on the
log after all.

Pure: no clock, no I/O. The caller reads the log (a stream, an export file, an in-memory log)
and shows the report; `progress` is called with the number of events folded so far.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from events import Event, JobNominated, JobPreemptionRequested
from policy.audit_judge import (
    DECISIONS,
    MISMATCHES,
    POLICY_ACTORS,
    AuditReport,
    Decision,
    Finding,
    Outcome,
    differences,
)
from policy.audit_replay import LAG, Replay

__all__ = [
    "DECISIONS",
    "MISMATCHES",
    "POLICY_ACTORS",
    "AuditReport",
    "Decision",
    "Finding",
    "Outcome",
    "Reader",
    "Scope",
    "as_document",
    "audit",
    "audit_document",
    "differences",
]

#: The log from a position on: `read(first)` gives the (sequence, event) pairs stored at
#: `first` or later, in sequence order, up to the end of the log as it is (a fresh iterator
#: each call).
Reader = Callable[[int], Iterable[tuple[int, Event]]]
Log = Sequence[tuple[int, Event]] | Reader


@dataclass(frozen=True, slots=True)
class Scope:
    """Which decisions to check: by log position (inclusive) and by job. The whole log is
    folded whatever the scope: a decision's state depends on everything before it."""

    first: int = 1
    last: int | None = None
    job: str | None = None

    def covers(self, seq: int, decision: Decision) -> bool:
        if seq < self.first or (self.last is not None and seq > self.last):
            return False
        return self.job is None or self.job in _jobs_named(decision)


def _jobs_named(decision: Decision) -> Iterable[str]:
    yield decision.job_id
    if isinstance(decision, JobNominated):
        yield from decision.victims
    elif isinstance(decision, JobPreemptionRequested) and decision.for_job is not None:
        yield decision.for_job


def audit(
    log: Log,
    scope: Scope = Scope(),
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
    lag: int = LAG,
) -> AuditReport:
    """Audit the decisions of `log` (in sequence order, from the start of the log: a list of
    pairs, or a `Reader`) in `scope`. `progress(events folded)` is called every `every` events
    and at the end; `lag`: how far the fold runs behind the reading (policy/audit_replay.py)."""
    read = log if callable(log) else _reader(log)
    report = AuditReport()
    replay = Replay(report, scope.covers, progress, every, lag)
    for seq, event in read(1):
        replay.read(seq, event)
    replay.finish()
    report.events = replay.state.events_applied
    if replay.late:
        _derive_late(read, replay, report)
    _leave_out_logged(read, report)
    report.findings.sort(key=lambda f: f.seq)
    return report


def _reader(log: Sequence[tuple[int, Event]]) -> Reader:
    def read(first: int) -> Iterator[tuple[int, Event]]:
        start = 0 if first <= 1 else bisect.bisect_left(log, first, key=lambda pair: pair[0])
        return itertools.islice(log, start, None)

    return read


def _derive_late(read: Reader, first: Replay, report: AuditReport) -> None:
    """The decisions read after the fold had gone past their basis, re-derived on a fold made
    again from the start up to their bases."""
    again = Replay(report, lambda _seq, _decision: False, lag=0)
    for seq, decision in first.late.items():
        again.expect(seq, decision, first.late_verdicts[seq])
    for seq, event in read(1):
        again.read(seq, event)
        if not again.expecting:
            break
    again.finish()


def _leave_out_logged(read: Reader, report: AuditReport) -> None:
    """What the policy gives instead of a decision it does not make is only what is nowhere on
    the log: read the log's decision ids again, for those findings alone."""
    named = {e.id for f in report.findings for e in f.instead}
    if not named:
        return
    logged = {e.id for _, e in read(1) if isinstance(e, DECISIONS) and e.id in named}
    report.findings = [
        dataclasses.replace(f, instead=tuple(e for e in f.instead if e.id not in logged))
        if f.instead
        else f
        for f in report.findings
    ]


def as_document(report: AuditReport) -> dict[str, Any]:
    """The report as plain data (JSON-ready): what `fairlane audit -o json` prints and what the
    read side's `/audit` endpoint answers with."""
    refused: dict[str, int] = {}
    for f in report.findings:
        if not f.verdict.applied:
            refused[f.verdict.reason] = refused.get(f.verdict.reason, 0) + 1
    return {
        "policy_version": report.policy_version,
        "events": report.events,
        "checked": report.checked,
        "matched": report.matched,
        "mismatched": len(report.mismatches),
        "not_compared": report.not_compared,
        "plans": report.plans,
        "usage_checked": report.usage_checked,
        "usage_matched": report.usage_matched,
        "refused": refused,
        "findings": [_finding_document(f) for f in report.findings],
    }


def _finding_document(f: Finding) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "seq": f.seq,
        "outcome": f.outcome,
        "policy_version": f.policy_version,
        "verdict": {"applied": f.verdict.applied, "reason": f.verdict.reason},
        "decision": msgspec.to_builtins(f.decision),
    }
    if f.derived is not None:
        doc["policy_gives"] = msgspec.to_builtins(f.derived)
        doc["differences"] = {
            name: {"recorded": msgspec.to_builtins(a), "policy": msgspec.to_builtins(b)}
            for name, (a, b) in differences(f.decision, f.derived).items()
        }
    if f.outcome == "not_derived":
        doc["policy_gives_instead"] = [msgspec.to_builtins(e) for e in f.instead]
    return doc


def audit_document(log: Log, scope: Scope = Scope()) -> dict[str, Any]:
    """One call for a reader (the API's `/audit`): audit `log` and answer with the document."""
    return as_document(audit(log, scope))
