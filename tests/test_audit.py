"""The audit: every decision on a recorded log is what the policy gives on the state it was
decided on, and a tampered decision is reported as exactly that.

The histories in tests/histories/ were recorded from the live engine (the real services on a
nats-server; `python -m tests.histories.record`), so these tests replay what the scheduler and
the preemptor really published, each with the log position it decided on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from events import (
    Event,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    ProjectTerms,
)
from events.export import ExportError, export_line, read_export
from policy.audit import Scope, as_document, audit, differences
from policy.version import POLICY_VERSION
from simulation.virtual_cluster import VirtualCluster

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.jsonl"))
TAMPERED = Path(__file__).parent / "histories" / "in-project-preemption-lowest-then-newest.jsonl"


def load(path: Path) -> list[tuple[int, Event]]:
    return list(read_export(path.read_bytes().splitlines()))


def test_there_are_recorded_histories_with_preemptions() -> None:
    assert len(HISTORIES) >= 3
    for path in HISTORIES:
        kinds = {type(e) for _, e in load(path)}
        assert {JobScheduled, JobNominated, JobPreemptionRequested} <= kinds, path.name


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_every_recorded_decision_is_what_the_policy_gives(path: Path) -> None:
    log = load(path)
    decisions = [e for _, e in log if isinstance(e, _DECISIONS)]
    assert all(d.policy_version == POLICY_VERSION for d in decisions), "published unstamped"
    report = audit(log)
    assert report.findings == [], [
        (f.seq, f.decision.id, f.outcome, f.verdict, differences(f.decision, f.derived))
        if f.derived is not None
        else (f.seq, f.decision.id, f.outcome, f.verdict, f.instead)
        for f in report.findings
    ]
    assert report.checked == sum(isinstance(e, _DECISIONS) for _, e in log) > 0
    assert report.matched == report.checked
    assert report.events == len(log)


_DECISIONS = (JobScheduled, JobNominated, JobPreemptionRequested)


def test_a_stop_sent_to_another_victim_is_the_one_mismatch() -> None:
    log = load(TAMPERED)
    at, real = next(
        (i, e)
        for i, (_, e) in enumerate(log)
        if isinstance(e, JobPreemptionRequested) and e.job_id == "p40"
    )
    assert isinstance(real, JobPreemptionRequested)
    forged = msgspec.structs.replace(
        real, job_id="p45", id=real.id.replace("p40/", "p45/", 1), attempt=1
    )
    log[at] = (log[at][0], forged)
    report = audit(log)
    assert report.checked - report.matched == 1
    [finding] = report.mismatches
    assert finding.seq == log[at][0] and finding.decision == forged
    assert finding.outcome == "not_derived"
    # what the policy gives instead: the stop of the real victim
    assert finding.instead == (real,)
    assert finding.policy_version == POLICY_VERSION


def test_another_victim_in_a_nomination_is_reported_with_the_policys_victims() -> None:
    log = load(TAMPERED)
    at, real = next((i, e) for i, (_, e) in enumerate(log) if isinstance(e, JobNominated))
    assert isinstance(real, JobNominated)
    forged = msgspec.structs.replace(real, victims=("p45",))
    log[at] = (log[at][0], forged)
    first = audit(log).findings[0]
    assert (first.seq, first.outcome, first.derived) == (log[at][0], "differs", real)
    # the fold refuses it: the GPUs it holds are not the named victim's
    assert not first.verdict.applied and first.verdict.reason


@pytest.mark.parametrize(
    ("field", "value", "outcome"),
    [
        ("actor", "scheduler", "differs"),
        ("reason", "reclaim", "differs"),
        # decided on another state or at another time: that plan has no such stop
        ("basis_seq", 3, "not_derived"),
        ("time", 0.5, "not_derived"),
    ],
)
def test_a_stop_changed_in_any_field_is_the_one_mismatch(
    field: str, value: object, outcome: str
) -> None:
    """Exact: the basis, the actor (the preemptor's own), the time and the reason count."""
    log = load(TAMPERED)
    at, real = next((i, e) for i, (_, e) in enumerate(log) if isinstance(e, JobPreemptionRequested))
    forged = msgspec.structs.replace(real, **{field: value})
    log[at] = (log[at][0], forged)
    [finding] = audit(log).mismatches
    assert (finding.seq, finding.outcome) == (log[at][0], outcome)
    if outcome == "differs":
        assert finding.derived is not None
        assert differences(forged, finding.derived) == {field: (value, getattr(real, field))}


def test_a_decision_of_another_policy_version_is_reported_not_failed() -> None:
    log = load(TAMPERED)
    at = next(i for i, (_, e) in enumerate(log) if isinstance(e, JobScheduled))
    seq, event = log[at]
    log[at] = (seq, msgspec.structs.replace(event, policy_version="0-older"))
    report = audit(log)
    assert report.clean and report.not_compared == 1
    [finding] = report.findings
    assert (finding.outcome, finding.policy_version) == ("other_version", "0-older")


def test_scope_by_job_and_position() -> None:
    log = load(TAMPERED)
    whole = audit(log)
    for_hi2 = audit(log, Scope(job="hi2"))
    # hi2's nomination, its placement, and the stops made for it
    assert 0 < for_hi2.checked < whole.checked
    late = audit(log, Scope(first=30, last=40))
    assert late.checked == sum(isinstance(e, _DECISIONS) and 30 <= s <= 40 for s, e in log)


def test_the_core_engines_log_audits_clean() -> None:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.set_project("b", {"default": ProjectTerms(quota=2)})
    vc.submit("long", JobSpec(project="a", gpus=4, duration_s=1000))
    vc.advance(100)
    vc.submit("short", JobSpec(project="b", gpus=2, duration_s=100))
    vc.submit("low", JobSpec(project="a", gpus=1, duration_s=50, priority=10))
    vc.advance(2000)
    log = list(enumerate(vc.log, 1))
    assert any(isinstance(e, JobNominated) for _, e in log)
    report = audit(log)
    assert report.checked >= 4 and report.matched == report.checked
    assert report.findings == []


def test_the_audit_refuses_a_log_out_of_order() -> None:
    log = load(TAMPERED)
    log[3], log[4] = log[4], log[3]
    with pytest.raises(ValueError, match="out of order"):
        audit(log)


def test_an_export_reads_back_and_a_bad_line_is_named() -> None:
    log = load(TAMPERED)
    lines = b"".join(export_line(s, e) for s, e in log).splitlines()
    assert list(read_export(lines)) == log
    with pytest.raises(ExportError, match="line 2"):
        list(read_export([lines[0], b'{"seq": 2, "event": {"type": "JobScheduled"}}']))
    with pytest.raises(ExportError, match="line 1"):
        list(read_export([b"not json"]))


def test_progress_is_reported_as_the_log_is_folded() -> None:
    log = load(TAMPERED)
    seen: list[int] = []
    audit(log, progress=seen.append, every=10)
    assert seen == [*range(10, len(log) + 1, 10), len(log)]


def test_the_audit_reads_the_log_as_it_folds() -> None:
    """Streaming: the fold is never more than `lag` events behind the reading, so the audit
    holds the fold and that window, never the whole log."""
    log = load(TAMPERED)
    read_so_far = 0

    def read(first: int) -> Iterator[tuple[int, Event]]:
        nonlocal read_so_far
        for seq, event in log:
            if seq >= first:
                read_so_far += 1
                yield seq, event

    behind: list[int] = []
    report = audit(
        read, progress=lambda folded: behind.append(read_so_far - folded), every=1, lag=5
    )
    assert report.clean and report.events == len(log)
    assert max(behind[:-1]) == 5 and read_so_far == len(log)  # one pass: nothing read again


@pytest.mark.parametrize("lag", [0, 1, 4])
@pytest.mark.parametrize("forged", [False, True])
def test_a_decision_read_after_the_fold_passed_its_basis_is_judged_the_same(
    lag: int, forged: bool
) -> None:
    """A decision published more than `lag` events after its basis (all of them with `lag` 0)
    is re-derived on a fold made again up to its basis: the same report, finding for finding,
    what the policy gives instead included."""
    log = load(TAMPERED)
    if forged:
        at, real = next(
            (i, e) for i, (_, e) in enumerate(log) if isinstance(e, JobPreemptionRequested)
        )
        log[at] = (log[at][0], msgspec.structs.replace(real, job_id="p45", id="p45/1/preempt/x"))
    whole = as_document(audit(log))
    late = as_document(audit(log, lag=lag))
    assert late["plans"] >= whole["plans"]  # a late decision's plan is derived once more
    assert {**late, "plans": 0} == {**whole, "plans": 0}
    named_instead = [f for f in whole["findings"] if f.get("policy_gives_instead")]
    assert bool(whole["mismatched"]) == bool(named_instead) == forged
