"""The audit's verdict on one decision: the recorded decision beside the one the policy gives,
and the report they add up to (see policy/audit.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from events import JobNominated, JobPreemptionRequested, JobScheduled
from events.model import UsageFacts
from policy.decisions import ACTOR, PREEMPTOR
from policy.state import Verdict
from policy.version import POLICY_VERSION

Decision = JobScheduled | JobNominated | JobPreemptionRequested
DECISIONS: Final = (JobScheduled, JobNominated, JobPreemptionRequested)
POLICY_ACTORS: Final = frozenset({ACTOR, PREEMPTOR})

Outcome = Literal["matches", "differs", "not_derived", "other_version", "other_actor"]
#: outcomes that count as a mismatch (the others are reported, not failed)
MISMATCHES: Final = frozenset({"differs", "not_derived"})

#: what re-deriving a decision found: the policy's decision of the same id (or None), and
#: otherwise the decisions of that plan by the same actor (what the policy does instead)
Derived = tuple[Decision | None, tuple[Decision, ...]]


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


def judge(
    report: AuditReport, seq: int, decision: Decision, verdict: Verdict, found: Derived
) -> None:
    """Count one decision in `report`, with a finding unless it is a plain match applied."""
    derived, instead = found
    report.checked += 1
    outcome = not_ours(decision)
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
        instead = instead if outcome == "not_derived" else ()
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


def not_ours(decision: Decision) -> Outcome | None:
    """`other_actor` or `other_version` for a decision this policy does not answer for."""
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


def differences(recorded: Decision, derived: Decision) -> dict[str, tuple[object, object]]:
    """The fields in which a recorded decision differs from the policy's: name -> (recorded,
    the policy's)."""
    skip = {"policy_version"}
    return {
        name: (getattr(recorded, name), getattr(derived, name))
        for name in recorded.__struct_fields__
        if name not in skip and getattr(recorded, name) != getattr(derived, name)
    }
