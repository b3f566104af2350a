"""One pool's share of a scheduling cycle: its idle GPUs, its accounts and the decisions made.

The schedulers (fair_share, priority, round_robin) decide *what*; this module carries out the
mechanics they share: placing a candidate, and holding GPUs for one while its victims stop.
Which victims is the victim search's (`policy/victim_search.py`); the events are built by
`policy/decisions.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from events import JobNominated, PreemptionFacts, Replica, SchedulerSettings
from events.catalogue import PreemptionReason
from policy.accounts import Accounts
from policy.candidates import Candidate, Shape, WaitReason, gate_ok
from policy.capacity import Capacity
from policy.decisions import Decisions
from policy.state import ClusterState, Job
from policy.victim_search import Taken, fits_with, new_taken
from policy.victims import VictimIndex, lost_work_gpu_s

if TYPE_CHECKING:
    from policy.schedulers.reclaim_order import Offers
    from policy.schedulers.reclaim_reach import Reach


class PoolCycle:
    def __init__(  # noqa: PLR0913 (a cycle is made from all of these)
        self,
        state: ClusterState,
        pool: str,
        settings: SchedulerSettings,
        capacity: Capacity,
        accounts: Accounts,
        decisions: Decisions,
        releasing: dict[str, list[int]] | None = None,
        waiting: dict[str, WaitReason] | None = None,
        waiting_for_room: list[list[Job]] | None = None,
    ) -> None:
        self.state = state
        self.pool = pool
        self.settings = settings
        self.capacity = capacity
        self.accounts = accounts
        self.decisions = decisions
        self.now = decisions.now
        #: GPUs being given back (stopping jobs, and what this cycle's victims free beyond the
        #: job they were taken for), not held for anyone: rule 7 counts them as free when
        #: deciding whether anyone must be preempted
        self.releasing: dict[str, list[int]] = releasing if releasing is not None else {}
        #: why each job left waiting waits (the last reason found for it this cycle)
        self.waiting: dict[str, WaitReason] = waiting if waiting is not None else {}
        #: jobs left waiting for room unless a reason is given for them (`wait_for_room`)
        self.waiting_for_room = waiting_for_room if waiting_for_room is not None else []
        #: surplus replicas each job gives up this cycle, and the victim units already taken
        self.surplus_stopped: dict[str, int] = {}
        self.used_units: set[int] = set()
        self.victims = VictimIndex(settings.victim_order, self.now, state.owners)
        self.generation = 0  # bumps on every decision, invalidating memos of failures
        # Decisions of this cycle, kept here rather than written into the state (which is input)
        self.stopping: set[str] = set()
        self.nominated: set[str] = set()
        #: the reclaim's bound on what victims could ever free per node (made when first
        #: asked), and the projects whose usage or victims changed since it last looked
        self.reach: Reach | None = None
        self.moved: set[str] = set()
        #: the reclaim's taking order per project that has victims, kept up to date
        #: (`reclaim_order.offers_of`)
        self.reclaim_offers: dict[str, Offers] = {}

    def close(self) -> None:
        """The cycle is over: drop the reclaim's lists and reach. They refer back to the cycle,
        and that loop kept everything the cycle made (its candidates, victim lineups and lists:
        80,000 objects at 4x the bench's size) alive past `decide` until the collector's next
        full pass, which then walked them all, reading the frozen state they point into: at 4x
        a full pass in most cycles, 20 to 70 ms each. Without the loop they go when `decide`
        returns."""
        self.reach = None
        self.reclaim_offers = {}

    def wait_for_room(self, cands: Iterable[Candidate]) -> None:
        """These candidates' jobs wait for room (`no_fit`) unless a reason is given for them
        in this cycle, before or after. Named only when the plan's `waiting` is read: the
        scheduler never asks, and naming them read every waiting job's id.

        The plan keeps the jobs, not the candidates: kept past the cycle, 40,000 candidates
        at 4x the bench's size were the most of what the collector's first pass after the
        cycle walked (the cycle's allocations count towards it), 11 to 14 ms of every
        cycle, against 1 for lists of the jobs (frozen with the state)."""
        self.waiting_for_room.append([cand.job for cand in cands])

    # -- placing ---------------------------------------------------------------------------------

    def try_place(self, cand: Candidate) -> bool:
        placed = self.capacity.place(
            cand.job.gpus, cand.replicas, self.settings.fitting, cand.job.node, cand.ports
        )
        if placed is None:
            return False
        self.schedule(cand, placed)
        return True

    def split_by_room(self, cands: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """Candidates that might fit the idle GPUs now, and those that cannot. Idle GPUs only
        shrink while a pass hands them out, so the second list needs no further look."""
        memo: dict[Shape, bool] = {}
        maybe: list[Candidate] = []
        never: list[Candidate] = []
        for cand in cands:
            shape = cand.shape()
            ok = memo.get(shape)
            if ok is None:
                ok = memo[shape] = self.capacity.fits(*shape)
            if ok:
                maybe.append(cand)
            else:
                self.waiting[cand.job.id] = "no_fit"
                never.append(cand)
        return maybe, never

    def schedule(self, cand: Candidate, replicas: list[Replica]) -> None:
        job = cand.job
        self.accounts.account(job.project).add(cand.gpus, job.preemptible)
        self.moved.add(job.project)
        if self.reach is not None:
            self.reach.touch({r.node for r in replicas})
        history = self.accounts.history_of((job.project,))
        if cand.extra:
            holds = cand.before + len(replicas)
            self.decisions.place(job, self.pool, replicas, holds=holds, history=history)
            # what this cycle gives a job, it does not take back in the same breath: a job
            # that grows now is no victim until the next cycle (its new replica would not even
            # count as surplus, and preempting it whole undoes the grant at once)
            self.victims.forget([job])
            return
        self.decisions.place(job, self.pool, replicas, history=history)
        self.generation += 1

    # -- preempting ------------------------------------------------------------------------------

    def commit_preemption(
        self, cand: Candidate, taken: Taken, reason: PreemptionReason, note: str
    ) -> None:
        """Hold GPUs (idle, releasing and the victims') for `cand`, then ask the victims to
        stop. The nomination goes first: the fold applies a victim's stop only if the
        nomination it serves was applied."""
        job = cand.job
        involved = {job.project} | {u.project for u in taken.units}
        # the accounts as they stand before this preemption, for the projects it involves
        fair_share, usage, quota = self.accounts.facts(involved)
        requests = taken.requests()
        nomination = self.nominate(cand, taken.overlay, tuple(v.id for v, _ in requests), reason)
        for victim, replicas in requests:
            count = replicas or victim.active_replicas - self.surplus_stopped.get(victim.id, 0)
            gpus = count * victim.gpus
            self.accounts.account(victim.project).remove(gpus, victim.preemptible)
            self.moved.add(victim.project)
            if replicas:
                self.surplus_stopped[victim.id] = self.surplus_stopped.get(victim.id, 0) + count
            else:
                self.stopping.add(victim.id)
                self.victims.forget([victim])
            if victim.lost_node:
                continue  # this cycle asks it to stop already (node_lost): ask once
            facts = PreemptionFacts(
                pool=self.pool,
                fair_share=dict(fair_share),
                usage=dict(usage),
                quota=dict(quota),
                victim_gpus=gpus,
                cost_gpu_s=round(lost_work_gpu_s(victim, self.now, count), 3),
                note=note,
                history=self.accounts.history_of(involved),
            )
            remaining = len(victim.held) - (replicas or len(victim.held))
            if replicas:
                remaining = victim.active_replicas - self.surplus_stopped[victim.id]
            self.decisions.preempt(victim, nomination, replicas, remaining, facts)
        self.used_units.update(id(u) for u in taken.units)
        self.victims.spend(taken.units)
        self.generation += 1

    def nominate(
        self,
        cand: Candidate,
        overlay: dict[str, list[int]],
        victims: tuple[str, ...],
        reason: PreemptionReason,
    ) -> JobNominated:
        """Hold GPUs for `cand` from the idle ones and `overlay` (releasing and freed GPUs);
        what the overlay holds beyond its need is releasing for the rest of the cycle."""
        job = cand.job
        placed = self.capacity.place(
            job.gpus, cand.replicas, self.settings.fitting, job.node, cand.ports, overlay
        )
        assert placed is not None, "the caller made sure it fits"
        before, self.releasing = self.releasing, _left_over(overlay, placed)
        self.accounts.account(job.project).add(cand.gpus, job.preemptible)
        self.moved.add(job.project)
        if self.reach is not None:
            self.reach.touch({r.node for r in placed} | set(before) | set(self.releasing))
        history = self.accounts.history_of(self._involved(job, victims))
        nomination = self.decisions.nominate(job, self.pool, placed, victims, reason, history)
        self.nominated.add(job.id)
        self.waiting[job.id] = "nominated"
        self.victims.forget([job])
        self.generation += 1
        return nomination

    def _involved(self, job: Job, victims: tuple[str, ...]) -> set[str]:
        """The projects a nomination involves: the nominee's and its victims'."""
        return {job.project, *(self.state.jobs[v].project for v in victims if v in self.state.jobs)}

    def try_releasing(self, cand: Candidate) -> bool:
        """Rule 7: a job that fits in idle plus releasing GPUs waits for them, nominated, and
        preempts nobody."""
        if not self.releasing or not gate_ok(self.accounts.account(cand.job.project), cand):
            return False
        taken = new_taken(self)
        if not fits_with(self, cand, taken):
            return False
        self.nominate(cand, taken.overlay, (), "priority" if cand.job.preemptible else "reclaim")
        return True

    def may_ask(self, cand: Candidate) -> bool:
        """A job that gave up GPUs this cycle, or was just granted some, asks for no more in
        the same breath (a victim taking its GPUs straight back would be ping-pong)."""
        job_id = cand.job.id
        return not (
            job_id in self.stopping or job_id in self.nominated or job_id in self.surplus_stopped
        )

    def delay_passed(self, cand: Candidate) -> bool:
        """Rule 7: the delay holds for the whole job, its extra replicas included."""
        job = cand.job
        return self.now - job.pending_since >= job.preemption_delay_s


def _left_over(overlay: dict[str, list[int]], placed: list[Replica]) -> dict[str, list[int]]:
    """The overlay's GPUs that `placed` does not use."""
    used: dict[str, set[int]] = {}
    for r in placed:
        used.setdefault(r.node, set()).update(r.gpus)
    left: dict[str, list[int]] = {}
    for node, gpus in overlay.items():
        taken = used.get(node)
        rest = [g for g in gpus if g not in taken] if taken else list(gpus)
        if rest:
            left[node] = rest
    return left
