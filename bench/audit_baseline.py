"""The BASELINE for bench/audit.py: `policy.audit.audit` as it was before it streamed, frozen
here so the benchmark can measure the old and the new on the same policy in one run. Not used
by anything else. It holds the whole log in memory (the caller's list) and folds it once.

The audit: does every decision on the log follow from the policy?

Given a log as (sequence, event) pairs, `audit` folds it once and, for each decision (a
placement, a nomination, a stop request), re-derives it: the state folded up to the decision's
`basis_seq`, the `Plan` of `decide(state, decision.time)`, and the decision of the same id in
that plan. The scheduler and the preemptor each publish their share of one plan with the plan's
basis, so the decisions with one basis and one time are one plan, re-derived once. A decision
matches when it is exactly the policy's, every field: basis, actor (the preemptor's decisions
carry its own), time, replicas, victims, reason and facts. Each decision's verdict from the fold
(applied, or refused and why) is reported too.

Pure: no clock, no I/O. The caller reads the log (a stream, an export file, an in-memory log)
and shows the report; `progress` is called with the number of events folded so far.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled
from events.model import UsageFacts
from policy.cycle import decide
from policy.decisions import ACTOR, PREEMPTOR
from policy.state import ClusterState, Verdict
from policy.version import POLICY_VERSION, stamped

Decision = JobScheduled | JobNominated | JobPreemptionRequested
DECISIONS: Final = (JobScheduled, JobNominated, JobPreemptionRequested)
POLICY_ACTORS: Final = frozenset({ACTOR, PREEMPTOR})

Outcome = Literal["matches", "differs", "not_derived", "other_version", "other_actor"]
#: outcomes that count as a mismatch (the others are reported, not failed)
MISMATCHES: Final = frozenset({"differs", "not_derived"})


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


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision checked."""

    seq: int
    decision: Decision
    outcome: Outcome
    #: what the fold did with it
    verdict: Verdict
    #: the decision of the same id the policy gives (None: the policy gives no such decision,
    #: or it was not re-derived: another policy version or actor)
    derived: Decision | None = None
    #: for a decision the policy does not give: the decisions of that plan, by the same actor,
    #: that are nowhere on the log (what the policy would have done instead)
    instead: tuple[Decision, ...] = ()

    @property
    def mismatch(self) -> bool:
        return self.outcome in MISMATCHES

    @property
    def policy_version(self) -> str:
        return self.decision.policy_version or "unstated"


@dataclass(slots=True)
class AuditReport:
    policy_version: str = POLICY_VERSION
    events: int = 0
    checked: int = 0
    matched: int = 0
    #: decisions made by another policy version or actor: reported, not compared
    not_compared: int = 0
    #: plans re-derived (one `decide` each)
    plans: int = 0
    refused: int = 0
    #: rule 11: decisions whose fair shares weighed the usage history (the recorded one or
    #: the policy's carries U and P), and those whose U and P are exactly the policy's
    usage_checked: int = 0
    usage_matched: int = 0
    #: every finding that is not a plain match applied by the fold: mismatches, other versions
    #: and actors, and decisions the fold refused
    findings: list[Finding] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Finding]:
        return [f for f in self.findings if f.mismatch]

    @property
    def clean(self) -> bool:
        return not self.mismatches


def audit(
    log: Sequence[tuple[int, Event]],
    scope: Scope = Scope(),
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
) -> AuditReport:
    """Audit the decisions of `log` (in sequence order, from the start of the log) in `scope`.
    `progress(events folded)` is called every `every` events and at the end."""
    wanted = {
        seq: event
        for seq, event in log
        if isinstance(event, DECISIONS) and scope.covers(seq, event)
    }
    replay = _Replay(wanted, {event.id for _, event in log if isinstance(event, DECISIONS)})
    report = replay.report
    verdicts: dict[int, Verdict] = {}
    previous = 0
    for seq, event in log:
        if seq <= previous:
            raise ValueError(f"the log is out of order: sequence {seq} after {previous}")
        # the states at bases in [previous, seq) are the state as it stands, before this event
        replay.derive_before(seq)
        verdict = replay.state.apply(event, seq)
        previous = seq
        if seq in wanted:
            verdicts[seq] = verdict
        report.events += 1
        if progress is not None and report.events % every == 0:
            progress(report.events)
    replay.derive_before(None)
    if progress is not None:
        progress(report.events)
    for seq, decision in wanted.items():
        _judge(report, seq, decision, verdicts[seq], replay.derived.get(seq, _NONE))
    return report


_Derived = tuple[Decision | None, tuple[Decision, ...]]
_NONE: Final[_Derived] = (None, ())


class _Replay:
    """The fold as it goes, and the plans to re-derive on it: basis -> decision time -> the
    decisions (by sequence) of that plan, for the decisions this policy is to answer for."""

    def __init__(self, wanted: dict[int, Decision], on_log: set[str]) -> None:
        self.state = ClusterState()
        self.wanted = wanted
        self.on_log = on_log
        self.report = AuditReport()
        self.derived: dict[int, _Derived] = {}
        self.plans: dict[int, dict[float, list[int]]] = {}
        for seq, decision in wanted.items():
            if _not_ours(decision) is None:
                by_time = self.plans.setdefault(decision.basis_seq, {})
                by_time.setdefault(decision.time, []).append(seq)
        self.bases = sorted(self.plans)
        self.cursor = 0

    def derive_before(self, before: int | None) -> None:
        """Re-derive the plans whose basis is the state as it stands (below `before`)."""
        bases, cursor = self.bases, self.cursor
        end = len(bases) if before is None else bisect.bisect_left(bases, before, lo=cursor)
        for basis in bases[cursor:end]:
            # a basis between two stored events (a gap in the sequence: a message the services
            # skipped as garbage) is the state before the later one, at the position they saw
            seen_at = self.state.position
            self.state.position = basis
            for now, members in self.plans[basis].items():
                self._derive(now, members)
            self.state.position = seen_at
        self.cursor = end

    def _derive(self, now: float, members: list[int]) -> None:
        self.report.plans += 1
        plan = decide(self.state, now)
        made = [stamped(e) for e in plan.events if isinstance(e, DECISIONS)]
        by_id = {e.id: e for e in made}
        for seq in members:
            decision = self.wanted[seq]
            same = by_id.get(decision.id)
            if same is not None:
                self.derived[seq] = (same, ())
                continue
            missing = (e for e in made if e.actor == decision.actor and e.id not in self.on_log)
            self.derived[seq] = (None, tuple(missing))


def _judge(
    report: AuditReport, seq: int, decision: Decision, verdict: Verdict, found: _Derived
) -> None:
    derived, instead = found
    report.checked += 1
    outcome = _not_ours(decision)
    if outcome is None:
        if derived is None:
            outcome = "not_derived"
        elif _same(decision, derived):
            outcome = "matches"
        else:
            outcome = "differs"
    if outcome == "matches":
        report.matched += 1
    elif outcome in ("other_version", "other_actor"):
        report.not_compared += 1
    if not verdict.applied:
        report.refused += 1
    _check_usage(report, decision, derived)
    if outcome != "matches" or not verdict.applied:
        report.findings.append(Finding(seq, decision, outcome, verdict, derived, instead))


def _check_usage(report: AuditReport, decision: Decision, derived: Decision | None) -> None:
    """Rule 11: the U (and P) a decision carries are re-derived with it, from the log folded
    up to its basis; counted on their own so the report can say so."""
    recorded = _history(decision)
    policy = _history(derived) if derived is not None else None
    if recorded is None and policy is None:
        return
    report.usage_checked += 1
    if derived is not None and recorded == policy:
        report.usage_matched += 1


def _history(decision: Decision) -> UsageFacts | None:
    if isinstance(decision, JobPreemptionRequested):
        return decision.facts.history if decision.facts is not None else None
    return decision.history


def _not_ours(decision: Decision) -> Outcome | None:
    if decision.actor not in POLICY_ACTORS:
        return "other_actor"
    if decision.policy_version not in ("", POLICY_VERSION):
        return "other_version"
    return None


def _same(recorded: Decision, derived: Decision) -> bool:
    """Exactly, every field: the basis, the actor, the time, the replicas, victims, reason and
    facts. A decision published unstamped (by an engine that does not stamp) is taken as this
    policy's."""
    if not recorded.policy_version:
        derived = msgspec.structs.replace(derived, policy_version="")
    return recorded == derived


def _jobs_named(decision: Decision) -> Iterable[str]:
    yield decision.job_id
    if isinstance(decision, JobNominated):
        yield from decision.victims
    elif isinstance(decision, JobPreemptionRequested) and decision.for_job is not None:
        yield decision.for_job


def differences(recorded: Decision, derived: Decision) -> dict[str, tuple[object, object]]:
    """The fields in which a recorded decision differs from the policy's: name -> (recorded,
    the policy's)."""
    skip = {"policy_version"}
    return {
        name: (getattr(recorded, name), getattr(derived, name))
        for name in recorded.__struct_fields__
        if name not in skip and getattr(recorded, name) != getattr(derived, name)
    }


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


def audit_document(log: Sequence[tuple[int, Event]], scope: Scope = Scope()) -> dict[str, Any]:
    """One call for a reader (the API's `/audit`): audit `log` and answer with the document."""
    return as_document(audit(log, scope))
