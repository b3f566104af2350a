"""The audit's pass over the log: read in order, fold behind the reading, and re-derive each plan
on the fold as it stands at the plan's basis.

A decision is published after the state it was decided on, so its basis is an earlier position
than its own. The fold therefore runs up to `LAG` events behind the reading: when it reaches a
basis, every decision published within `LAG` events of it has been read, and the plan they share
is re-derived there, once. Memory is the fold and those `LAG` events, not the log.

A decision read when the fold has already gone past its basis (published more than `LAG` events
after it: a stalled service) is late: `Replay.late` holds it, and `policy.audit` re-derives it
after this pass on a fold made again up to its basis.

Pure: the caller gives the events one at a time (`read`) and says when the log ends (`finish`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Final

from events import Event
from policy.audit_judge import DECISIONS, AuditReport, Decision, Derived, judge, not_ours
from policy.cycle import decide
from policy.state import ClusterState, Verdict
from policy.version import stamped

#: How far (in events) the fold runs behind the reading: a decision published up to this many
#: events after its basis is re-derived in the one pass. Live logs publish a plan's decisions a
#: few events after its basis; 10,000 events are a few MiB.
LAG: Final = 10_000


class Replay:
    """One pass: `read` each event of the log in order, then `finish`."""

    def __init__(
        self,
        report: AuditReport,
        covers: Callable[[int, Decision], bool],
        progress: Callable[[int], None] | None = None,
        every: int = 10_000,
        lag: int = LAG,
    ) -> None:
        self.report = report
        self.covers = covers
        self.progress = progress
        self.every = every
        self.lag = lag
        self.state = ClusterState()
        self.last_read = 0
        #: read, not yet folded
        self.ahead: deque[tuple[int, Event]] = deque()
        #: the sequence of the last event folded
        self.folded = 0
        #: the plans to re-derive: basis -> decision time -> the sequences of its decisions
        self.plans: dict[int, dict[float, list[int]]] = {}
        #: the bases of `plans`, smallest first
        self.bases: list[int] = []
        #: the decisions read in scope and not judged yet: by sequence
        self.wanted: dict[int, Decision] = {}
        #: what re-deriving found for the decisions not yet folded (by sequence)
        self.derived: dict[int, Derived] = {}
        #: the fold's verdicts on decisions whose plan is still to re-derive
        self.verdicts: dict[int, Verdict] = {}
        #: decisions read after the fold went past their basis: their verdicts come with them
        #: once folded; `policy.audit` re-derives them
        self.late: dict[int, Decision] = {}
        self.late_verdicts: dict[int, Verdict] = {}

    def read(self, seq: int, event: Event) -> None:
        if seq <= self.last_read:
            raise ValueError(f"the log is out of order: sequence {seq} after {self.last_read}")
        self.last_read = seq
        if isinstance(event, DECISIONS) and self.covers(seq, event):
            self._want(seq, event)
        self.ahead.append((seq, event))
        if len(self.ahead) > self.lag:
            self._fold_next()

    def expect(self, seq: int, decision: Decision, verdict: Verdict) -> None:
        """Re-derive `decision` (folded at `seq` with `verdict`) when the fold reaches its basis:
        for a decision read late, on a fold made again from the start."""
        self.verdicts[seq] = verdict
        self._plan(seq, decision)

    @property
    def expecting(self) -> bool:
        """Some plan is still to be re-derived."""
        return bool(self.bases)

    def finish(self) -> None:
        while self.ahead:
            self._fold_next()
        self._derive_below(None)
        if self.progress is not None:
            self.progress(self.state.events_applied)

    def _want(self, seq: int, decision: Decision) -> None:
        if not_ours(decision) is not None:  # judged as it is folded: nothing to re-derive
            self.wanted[seq] = decision
            self.derived[seq] = (None, ())
        elif decision.basis_seq < self.folded:
            self.late[seq] = decision
        else:
            self._plan(seq, decision)

    def _plan(self, seq: int, decision: Decision) -> None:
        self.wanted[seq] = decision
        if decision.basis_seq not in self.plans:
            heapq.heappush(self.bases, decision.basis_seq)
        by_time = self.plans.setdefault(decision.basis_seq, {})
        by_time.setdefault(decision.time, []).append(seq)

    def _fold_next(self) -> None:
        seq, event = self.ahead.popleft()
        # the plans decided on the state as it stands (every basis below this event)
        self._derive_below(seq)
        verdict = self.state.apply(event, seq)
        self.folded = seq
        if seq in self.late:
            self.late_verdicts[seq] = verdict
        elif seq in self.wanted:
            if seq in self.derived:
                self._judge(seq, verdict, self.derived.pop(seq))
            else:  # decided on a basis after itself: judged when that plan is re-derived
                self.verdicts[seq] = verdict
        applied = self.state.events_applied
        if self.progress is not None and applied % self.every == 0:
            self.progress(applied)

    def _derive_below(self, before: int | None) -> None:
        while self.bases and (before is None or self.bases[0] < before):
            basis = heapq.heappop(self.bases)
            for now, members in self.plans.pop(basis).items():
                self.report.plans += 1
                found = derive(self.state, basis, now, [self.wanted[s] for s in members])
                for seq, result in zip(members, found, strict=True):
                    if seq in self.verdicts:
                        self._judge(seq, self.verdicts.pop(seq), result)
                    else:
                        self.derived[seq] = result

    def _judge(self, seq: int, verdict: Verdict, found: Derived) -> None:
        judge(self.report, seq, self.wanted.pop(seq), verdict, found)


def derive(state: ClusterState, basis: int, now: float, decisions: list[Decision]) -> list[Derived]:
    """What the policy gives on `state` (the fold up to `basis`) at `now` for each decision of
    one plan: the decision of the same id, else the plan's decisions by the same actor (what
    it would have done instead; `policy.audit` leaves out those that are on the log)."""
    # a basis between two stored events (a gap in the sequence: a message the services skipped
    # as garbage) is the state before the later one, at the position they saw
    seen_at = state.position
    state.position = basis
    try:
        plan = decide(state, now)
    finally:
        state.position = seen_at
    made = [stamped(e) for e in plan.events if isinstance(e, DECISIONS)]
    by_id = {e.id: e for e in made}
    found: list[Derived] = []
    for decision in decisions:
        same = by_id.get(decision.id)
        if same is not None:
            found.append((same, ()))
        else:
            found.append((None, tuple(e for e in made if e.actor == decision.actor)))
    return found
