"""Invariants of the policy over random clusters and random command sequences (hypothesis).

A stateful test drives a `VirtualCluster` (the policy plus simulated executors that answer at
once) through random commands on a random cluster: 1-4 pools under any scheduler, fitting and
victim order, nodes of 0-8 GPUs, 1-5 projects with random quotas, weights, limits and
priorities, and jobs of every shape (gangs, elastic, pinned, non-preemptible, with min_runtime
and preemption_delay, with or without a duration and checkpoints). After every command:

- before settling: replaying the log into a fresh state gives the same state and the same
  decisions, and `decide()` does not touch its input;
- while settling, for every decision as it is recorded: a job is never preempted to make room
  (reason `priority` or `reclaim`) if it is non-preemptible or inside its min_runtime, nor for a
  pending job inside its preemption_delay; a `priority` victim has a lower priority than the
  job it makes room for; a `reclaim` goes from a project above its quota to one below its fair
  share (as the recorded facts show); what a preemption says it takes is what the job holds;
  and every placement and nomination takes effect (the fold never has to refuse one: the
  policy gave out only GPUs that were free);
- once settled: the GPUs each job holds, rebuilt from the JobScheduled replicas in the log
  independently of the fold, are the state's `held`; no GPU index is held twice and no node
  holds more than it has; every holding job runs with whole gangs (min_replicas to replicas
  replicas of all its GPUs); limits hold (fair_share and round_robin pools); non-preemptible
  usage stays within quota (fair_share pools); more cycles decide nothing, and an hour more with
  no job finishing changes nothing once the timers (min_runtime, preemption_delay) have run out
  (a longer soak once found a reclaim ping-pong, kept as a test at the end); and no cycle of
  reclaims between jobs while the cluster settles after a step.

Cases the properties found are kept at the end as plain tests.

Settings: the profile conftest.py loads ("dev", or with CI=true the derandomized "ci"), with
this file's number of examples (FAIRLANE_POLICY_EXAMPLES, for a longer soak).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from events import (
    CheckpointModel,
    ClusterConfigured,
    ClusterSettings,
    Event,
    JobCompleted,
    JobFailed,
    JobNominated,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    NodeLost,
    NodeRegistered,
    PoolConfigured,
    PortMapping,
    ProjectTerms,
    Replica,
    SchedulerSettings,
)
from events.catalogue import MAKES_ROOM
from policy.cycle import decide, next_wakeup
from policy.state import HOLDING_PHASES, ClusterState, Job, Verdict
from simulation.virtual_cluster import VirtualCluster
from tests.policy_bounds import walking_every_victim

POOLS = ("p0", "p1", "p2", "p3")
PROJECTS = ("a", "b", "c", "d", "e")

# -- random clusters --------------------------------------------------------------------------


@dataclass
class ClusterSpec:
    scheduler: SchedulerSettings
    pools: list[tuple[str, SchedulerSettings | None]]
    nodes: list[tuple[str, int]]  # (pool, gpus)
    projects: dict[str, dict[str, ProjectTerms]] = field(default_factory=dict)


scheduler_settings = st.builds(
    SchedulerSettings,
    type=st.sampled_from(["fair_share", "fair_share", "fair_share", "priority", "round_robin"]),
    fitting=st.sampled_from(["best", "worst"]),
    victim_order=st.sampled_from(["newest", "cost"]),
)

project_terms = st.builds(
    ProjectTerms,
    quota=st.integers(0, 8),
    over_quota_weight=st.integers(0, 3),
    limit=st.one_of(st.none(), st.integers(1, 16)),
    priority=st.sampled_from([50, 100, 100, 200]),
)


@st.composite
def cluster_specs(draw: st.DrawFn) -> ClusterSpec:
    pools = POOLS[: draw(st.integers(1, 4))]
    own = st.one_of(st.none(), st.none(), scheduler_settings)
    spec = ClusterSpec(
        scheduler=draw(scheduler_settings),
        pools=[(p, draw(own)) for p in pools],
        nodes=draw(
            st.lists(
                st.tuples(st.sampled_from(pools), st.sampled_from([0, 1, 2, 3, 4, 4, 8, 8])),
                min_size=len(pools) + 1,
                max_size=len(pools) + 6,
            )
        ),
    )
    for name in PROJECTS[: draw(st.integers(1, 5))]:
        # a project may have no terms in some pools (no quota there)
        spec.projects[name] = draw(st.dictionaries(st.sampled_from(pools), project_terms))
    return spec


@dataclass(frozen=True)
class JobDraw:
    """A job to submit; project, pools and pin are indexes into what the cluster has."""

    project: int
    pools: tuple[int, ...]
    pin: int | None
    gpus: int
    replicas: int
    min_replicas: int | None
    priority: int | None
    preemptible: bool | None
    min_runtime: float
    delay: float
    duration: float | None
    checkpoint: bool
    #: host ports each replica publishes (few, so that jobs ask for the same ones)
    ports: tuple[int, ...] = ()


job_draws = st.builds(
    JobDraw,
    project=st.integers(0, 4),
    pools=st.lists(st.integers(0, 3), max_size=2, unique=True).map(tuple),
    pin=st.sampled_from([None] * 8 + list(range(8))),
    gpus=st.sampled_from([0, 1, 1, 1, 1, 2, 2, 3, 4, 8]),
    replicas=st.integers(1, 3),
    min_replicas=st.one_of(st.none(), st.none(), st.integers(1, 3)),
    priority=st.sampled_from([None, 40, 50, 75, 100, 125]),
    preemptible=st.sampled_from([None, True, False]),
    min_runtime=st.sampled_from([0.0, 0.0, 0.0, 120.0, 600.0]),
    delay=st.sampled_from([0.0, 0.0, 0.0, 60.0, 300.0]),
    duration=st.sampled_from([None, None, 60.0, 400.0, 1500.0]),
    checkpoint=st.booleans(),
    ports=st.sampled_from([(), (), (), (), (), (8888,), (8888,), (6006,), (8888, 6006)]),
)


# -- the GPUs each job holds, rebuilt from the log without the fold ------------------------------


class Holdings:
    """Who holds which GPU, from NodeRegistered/NodeLost, JobScheduled replicas and the events
    that give GPUs back. A placement on a GPU that is missing or already held is reported."""

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.held: dict[str, list[Replica]] = {}
        self.read = 0  # events of the log seen so far
        #: where in the log decisions the fold refused are (stale views; a later decision may
        #: reuse a refused one's id, since ids derive from their inputs)
        self.refused: set[int] = set()

    def follow(self, log: list[Event]) -> None:
        for at in range(self.read, len(log)):
            if at not in self.refused:
                self.apply(log[at])
        self.read = len(log)

    def apply(self, event: Event) -> None:
        if isinstance(event, NodeRegistered):
            self.nodes[event.node] = event.gpus
        elif isinstance(event, NodeLost):
            self.nodes.pop(event.node, None)
            for job, replicas in self.held.items():
                self.held[job] = [r for r in replicas if r.node != event.node]
        elif isinstance(event, JobScheduled):
            owners = self.owners()
            for r in event.replicas:
                assert r.node in self.nodes, f"{event.id}: placed on unknown node {r.node}"
                assert len(set(r.gpus)) == len(r.gpus), f"{event.id}: a GPU twice in a replica"
                for g in r.gpus:
                    assert 0 <= g < self.nodes[r.node], f"{event.id}: no GPU {g} on {r.node}"
                    other = owners.get((r.node, g))
                    assert other is None, f"{event.id}: GPU {r.node}/{g} already held by {other}"
                    owners[r.node, g] = event.job_id
            mine = self.held.setdefault(event.job_id, [])
            if not event.scale_up:
                assert not mine, f"{event.id}: {event.job_id} placed while holding {mine}"
            mine.extend(event.replicas)
        elif isinstance(event, JobPreempted):
            mine = self.held.get(event.job_id, [])
            if event.replicas == 0 or event.replicas >= len(mine):
                self.held[event.job_id] = []
            else:
                del mine[len(mine) - event.replicas :]
        elif isinstance(event, JobCompleted | JobFailed):
            self.held[event.job_id] = []

    def owners(self) -> dict[tuple[str, int], str]:
        return {(r.node, g): job for job, rs in self.held.items() for r in rs for g in r.gpus}


def _holdings(state: ClusterState) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (project, pool): the GPUs its jobs hold or have held for them, and of those its
    non-preemptible jobs'."""
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for job in state.live.values():
        for pool, gpus in (
            (job.pool if job.phase in HOLDING_PHASES else None, len(job.held) * job.gpus),
            (job.nomination_pool, len(job.nomination) * job.gpus),
        ):
            if pool is not None and gpus:
                used, np_used = found.get((job.project, pool), (0, 0))
                np_gpus = 0 if job.preemptible else gpus
                found[job.project, pool] = (used + gpus, np_used + np_gpus)
    return found


class CheckedCluster(VirtualCluster):
    """A virtual cluster that shows each event it records with the fold's verdict."""

    on_verdict: Callable[[Event, Verdict], None] | None = None

    def record(self, event: Event) -> Verdict:
        verdict = super().record(event)
        if self.on_verdict is not None:
            self.on_verdict(event, verdict)
        return verdict


# -- the machine --------------------------------------------------------------------------------


class PolicyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.vc = CheckedCluster()
        self.holdings = Holdings()
        self.jobs: list[str] = []
        self.node_names: list[str] = []  # every node ever registered, lost ones included
        self.stale = False  # applying decisions made on a stale view: they may be refused
        self.stopping_before: dict[str, int] = {}  # each job's stop_replicas before its event
        #: per (project, pool) whose terms were lowered: what it held (all, non-preemptible)
        #: then, or less since (`limits_and_quotas_hold`)
        self.held_over: dict[tuple[str, str], tuple[int, int]] = {}
        #: every event id recorded so far, and whether that event had an effect
        self.ids: dict[str, bool] = {}

    # -- setup and commands ----------------------------------------------------------------------

    @initialize(spec=cluster_specs())
    def build(self, spec: ClusterSpec) -> None:
        vc = self.vc
        vc.observer, vc.on_verdict = self.check_decision, self.check_unique
        vc.configure(
            ClusterConfigured(
                id="cluster",
                time=0.0,
                actor="t",
                settings=ClusterSettings(scheduler=spec.scheduler),
            )
        )
        for name, own in spec.pools:
            vc.add_pool(
                name,
                PoolConfigured(id=f"pool-{name}", time=0.0, actor="t", pool=name, scheduler=own),
            )
        for pool, gpus in spec.nodes:
            self.add_node_to(pool, gpus)
        for name, terms in spec.projects.items():
            vc.set_project(name, terms)
        self.step()

    def add_node_to(self, pool: str, gpus: int, name: str | None = None) -> None:
        if name is None:
            name = f"n{len(self.node_names)}"
            self.node_names.append(name)
        self.vc.add_node(name, pool, gpus)

    @rule(job=job_draws)
    def submit(self, job: JobDraw) -> None:
        self.submit_one(job)
        self.step()

    @rule(batch=st.lists(job_draws, min_size=2, max_size=5))
    def submit_many(self, batch: list[JobDraw]) -> None:
        for job in batch:
            self.submit_one(job)
        self.step()

    def submit_one(self, job: JobDraw) -> None:
        projects = sorted(self.vc.state.projects)
        pools = sorted(self.vc.state.pools)
        nodes = list(self.vc.state.nodes) or self.node_names
        job_id = f"j{len(self.jobs)}"
        self.jobs.append(job_id)
        spec = JobSpec(
            project=projects[job.project % len(projects)],
            priority=job.priority,
            preemptible=job.preemptible,
            gpus=job.gpus,
            replicas=job.replicas,
            min_replicas=None if job.min_replicas is None else min(job.min_replicas, job.replicas),
            pools=()
            if job.pin is not None
            else tuple(dict.fromkeys(pools[i % len(pools)] for i in job.pools)),
            node=None if job.pin is None else nodes[job.pin % len(nodes)],
            preemption_delay_s=job.delay,
            min_runtime_s=job.min_runtime,
            duration_s=job.duration,
            checkpoint=CheckpointModel(every_s=100, save_s=5, restore_s=10)
            if job.checkpoint
            else None,
            ports=tuple(PortMapping(p, p) for p in job.ports),
        )
        self.vc.submit(job_id, spec)

    @rule(
        command=st.sampled_from(["complete", "complete", "cancel", "pause", "resume", "resume"]),
        index=st.integers(0, 50),
    )
    def job_command(self, command: str, index: int) -> None:
        if self.jobs:  # (no precondition: those make hypothesis throw examples away)
            getattr(self.vc, command)(self.jobs[index % len(self.jobs)])
        self.step()

    @rule(
        remove=st.sampled_from([False, False, True]),
        index=st.integers(0, 12),
        gpus=st.sampled_from([0, 1, 2, 4, 6, 8, 8]),
        again=st.booleans(),
    )
    def change_nodes(self, remove: bool, index: int, gpus: int, again: bool) -> None:
        state = self.vc.state
        if remove and state.nodes:
            names = list(state.nodes)
            self.vc.remove_node(names[index % len(names)])
        else:
            pools = sorted(state.pools)
            lost = [n for n in self.node_names if n not in state.nodes]
            # a lost node may come back under its old name (an executor restarted)
            name = lost[0] if again and lost else None
            self.add_node_to(pools[index % len(pools)], gpus, name)
        self.step()

    @rule(project=st.integers(0, 4), pool=st.integers(0, 3), terms=project_terms)
    def change_project(self, project: int, pool: int, terms: ProjectTerms) -> None:
        """A project's terms in one pool change, lowered as often as raised. What it holds
        then stays (nothing is preempted for a lower quota or limit); from then on it gets
        GPUs only within the new terms."""
        state = self.vc.state
        name = sorted(state.projects)[project % len(state.projects)]
        pool_name = sorted(state.pools)[pool % len(state.pools)]
        used, np_used = _holdings(state).get((name, pool_name), (0, 0))
        before = self.held_over.get((name, pool_name), (0, 0))
        self.held_over[name, pool_name] = (max(used, before[0]), max(np_used, before[1]))
        self.vc.set_project(name, {**state.projects[name].terms, pool_name: terms})
        self.step()

    @rule(seconds=st.sampled_from([1, 30, 61, 120, 301, 700, 3600]))
    def advance(self, seconds: int) -> None:
        self.vc.advance(seconds)
        self.step()

    # -- after every command ---------------------------------------------------------------------

    def step(self) -> None:
        """Checks on the unsettled state (determinism, purity), then settle."""
        state, now = self.vc.state, self.vc.now
        replayed = ClusterState()
        replayed.apply_all(self.vc.log)
        assert replayed == state, "replaying the log gives another state"
        before = copy.deepcopy(state)
        decisions = decide(state, now)
        assert state == before, "decide() changed its input"
        assert decide(replayed, now) == decisions, "the same log gives other decisions"
        assert decide(state, now) == decisions, "decide() is not deterministic"
        with walking_every_victim():
            assert decide(state, now) == decisions, "a bound skipped a walk that would succeed"
        check_plan(state, decisions.events)
        check_indexes(state)
        start = len(self.vc.log)
        self.vc.settle()
        check_no_reclaim_cycle(self.vc.log[start:], self.vc.state)

    @rule(back=st.integers(1, 40))
    def decide_on_a_stale_view(self, back: int) -> None:
        """A decider whose view is `back` events behind the log decides, and its decisions
        land on the log as it is: the fold referees them. Nothing it decides may give a GPU
        twice (the independent holdings check that once settled), and no victim is stopped
        for a nomination the fold refused."""
        log = self.vc.log
        stale = ClusterState()
        stale.apply_all(log[: max(0, len(log) - back)])
        plan = decide(stale, self.vc.now)
        applied_nominations: set[str] = set()
        self.stale = True
        try:
            for event in plan.events:
                verdict = self.vc.record(event)
                if not verdict.applied:
                    self.holdings.refused.add(len(self.vc.log) - 1)
                    continue
                if isinstance(event, JobNominated):
                    applied_nominations.add(event.id)
                elif isinstance(event, JobPreemptionRequested) and event.causation:
                    assert event.causation in applied_nominations, (
                        f"{event.id}: a victim stopped for the refused {event.causation}"
                    )
                self.vc._execute(event)
        finally:
            self.stale = False
        self.step()

    @rule()
    def repeat_the_last_event(self) -> None:
        """The same event delivered twice in a row has no second effect."""
        if not self.vc.log:
            return
        state = self.vc.state
        before = copy.deepcopy(state)
        verdict = state.apply(self.vc.log[-1])
        # (the counters of events seen move on; the replay check in step() compares them)
        state.events_applied, state.position = before.events_applied, before.position
        assert state == before, f"{self.vc.log[-1].id} applied twice had a second effect"
        note_event(f"a repeat was {'applied' if verdict.applied else 'refused'}")

    def check_unique(self, event: Event, verdict: Verdict) -> None:
        """The stream drops an event whose id it holds already (its duplicate window): an
        event that has an effect must not carry the id of an earlier one, or on a cluster that
        effect is lost (a decision refused once and made again under the same id was: the
        services never got past it)."""
        earlier = self.ids.get(event.id)
        assert earlier is None or not verdict.applied, (
            f"{event.id} has an effect, but the stream would drop it as a repeat of an earlier "
            f"{'applied' if earlier else 'refused'} event"
        )
        self.ids.setdefault(event.id, verdict.applied)

    def check_decision(self, event: Event) -> None:
        """Every event as it is recorded (the state has just applied it)."""
        if not self.stale:
            self.check_applied(event)
        job_id = getattr(event, "job_id", None)
        if job_id in self.vc.state.jobs:
            self.stopping_before[job_id] = self.vc.state.jobs[job_id].stop_replicas

    def check_applied(self, event: Event) -> None:
        state = self.vc.state
        if isinstance(event, JobPreemptionRequested) and event.reason in MAKES_ROOM:
            victim = state.jobs[event.job_id]
            assert victim.preemptible, f"{event.id}: non-preemptible {victim.id} preempted"
            if victim.min_runtime_s > 0:
                assert victim.started_at is not None, f"{event.id}: {victim.id} not started"
                ran = event.time - victim.started_at
                assert ran >= victim.min_runtime_s, f"{event.id}: inside min_runtime ({ran}s)"
            claimant = state.jobs[event.for_job or ""]
            if claimant.phase == "pending":
                waited = event.time - claimant.pending_since
                assert waited >= claimant.preemption_delay_s, (
                    f"{event.id}: {claimant.id} preempts after {waited}s of its "
                    f"{claimant.preemption_delay_s}s preemption_delay"
                )
            if event.reason == "priority":
                assert victim.priority < claimant.priority, f"{event.id}: not lower priority"
            facts = event.facts
            assert facts is not None, f"{event.id}: a preemption without its facts"
            # what the decision says it takes is what the job holds: a job that got GPUs
            # earlier in the same cycle must not be preempted for what it held before, and a
            # whole stop takes only the replicas that were not being stopped already
            stops = event.replicas or len(victim.held) - self.stopping_before.get(victim.id, 0)
            assert facts.victim_gpus == stops * victim.gpus, (
                f"{event.id}: takes {facts.victim_gpus} GPUs but stops {stops} x {victim.gpus}"
            )
            if event.reason == "reclaim":
                # rule 5, as the facts recorded before the victims were taken show it
                mine, theirs = claimant.project, victim.project
                assert mine != theirs, f"{event.id}: a reclaim inside {mine}"
                assert facts.usage.get(mine, 0) < facts.fair_share.get(mine, 0), (
                    f"{event.id}: {mine} reclaims at or above its fair share: {facts}"
                )
                # its quota counted at most up to its limit (a limit lowered below the quota,
                # the project holding more than it: it gives down to the limit)
                limit = state.projects[theirs].in_pool(facts.pool).limit
                quota = facts.quota.get(theirs, 0)
                floor = quota if limit is None else min(quota, limit)
                assert facts.usage.get(theirs, 0) > floor, (
                    f"{event.id}: {theirs} gives GPUs while within its quota: {facts}"
                )
        elif isinstance(event, JobScheduled):
            held = state.jobs[event.job_id].held
            assert all(r in held for r in event.replicas), f"{event.id} was refused by the fold"
        elif isinstance(event, JobNominated):
            job = state.jobs[event.job_id]
            assert job.nomination == event.replicas, f"{event.id} was refused by the fold"

    # -- once settled ----------------------------------------------------------------------------

    @invariant()
    def gpus_are_held_once(self) -> None:
        state = self.vc.state
        self.holdings.follow(self.vc.log)
        for job in state.jobs.values():
            assert self.holdings.held.get(job.id, []) == job.held, (
                f"{job.id}: the log's replicas {self.holdings.held.get(job.id)} but the state "
                f"holds {job.held}"
            )
        per_node: dict[str, list[int]] = {}
        for job in state.live.values():
            for r in job.held:
                per_node.setdefault(r.node, []).extend(r.gpus)
        for name, gpus in per_node.items():
            node = state.nodes[name]
            assert len(gpus) == len(set(gpus)), f"a GPU of {name} is held twice: {sorted(gpus)}"
            assert len(gpus) <= node.gpus, f"{name} holds {len(gpus)} of its {node.gpus} GPUs"
            assert all(0 <= g < node.gpus for g in gpus), f"{name}: GPU index out of range"
            owners = state.owners.get(name, {})
            assert sorted(owners) == sorted(gpus), f"{name}: owners index disagrees with held"

    @invariant()
    def gangs_are_whole(self) -> None:
        for job in self.vc.state.live.values():
            if not job.held:
                continue
            assert job.phase == "running", f"{job.id} holds GPUs while {job.phase} once settled"
            assert job.min_replicas <= len(job.held) <= job.replicas, (
                f"{job.id}: {len(job.held)} replicas, wants {job.min_replicas}..{job.replicas}"
            )
            assert all(len(r.gpus) == job.gpus for r in job.held), f"{job.id}: short replica"
            assert job.stop_replicas == 0, f"{job.id}: still stopping once settled"

    @invariant()
    def limits_and_quotas_hold(self) -> None:
        """What a project holds (GPUs held for it included) stays within its limit, and its
        non-preemptible work within its quota in a fair-share pool; or, where its terms were
        lowered below what it held, at most what it held then, and never more than it has
        held since: it got no GPUs while over them."""
        state = self.vc.state
        for key, (used, np_used) in _holdings(state).items():
            project, pool = key
            kind = state.pool_settings(pool).type
            terms = state.projects[project].in_pool(pool)
            over, np_over = self.held_over.get(key, (0, 0))
            if kind != "priority" and terms.limit is not None:
                assert used <= max(terms.limit, over), (
                    f"{project} holds {used} in {pool}, limit {terms.limit} (held {over})"
                )
            if kind == "fair_share":
                assert np_used <= max(terms.quota, np_over), (
                    f"{project} holds {np_used} non-preemptible GPUs in {pool}, "
                    f"quota {terms.quota} (held {np_over})"
                )
            if key in self.held_over:
                self.held_over[key] = (min(over, used), min(np_over, np_used))

    @invariant()
    def a_host_port_is_published_once_per_node(self) -> None:
        """Rebuilt from the log's placements (`Holdings`), not from the fold."""
        published: dict[tuple[str, int], str] = {}
        for job_id, replicas in self.holdings.held.items():
            ports = self.vc.state.jobs[job_id].spec.host_ports()
            nodes = [r.node for r in replicas]
            assert not ports or len(nodes) == len(set(nodes)), f"{job_id}: two replicas on a node"
            for node in set(nodes):
                for port in ports:
                    other = published.setdefault((node, port), job_id)
                    assert other == job_id, f"host port {port} on {node}: {other} and {job_id}"

    @invariant()
    def work_is_conserved(self) -> None:
        """Once settled, no pending job that passes every gate fits the idle GPUs of a pool of
        its list (no head-of-line blocking in any scheduler)."""
        state = self.vc.state
        if state.held:
            return
        for job in state.live.values():
            if job.phase != "pending" or job.nomination:
                continue
            for pool in job.pools:
                if (
                    pool in state.pools
                    and fits_idle(state, job, pool)
                    and gate_open(state, job, pool)
                ):
                    raise AssertionError(f"{job.id} waits though it fits the idle GPUs of {pool}")

    @invariant()
    def settled_stays_settled(self) -> None:
        vc = self.vc
        assert decide(vc.state, vc.now).events == [], "settle() left decisions to make"
        vc.observer, vc.on_verdict = None, None
        probe = copy.deepcopy(vc)
        vc.observer, vc.on_verdict = self.check_decision, self.check_unique
        probe.work.clear()  # no job finishes: only time passes
        if next_wakeup(probe.state, probe.now) is not None:
            # timers still run: let them run out (what they unlock may legitimately move jobs)
            probe.advance(3600)
        before = {j.id: (j.phase, list(j.held)) for j in probe.state.live.values()}
        start = len(probe.log)
        probe.advance(3600)
        changes = [
            e
            for e in probe.log[start:]
            if isinstance(e, JobScheduled | JobPreemptionRequested | JobNominated)
        ]
        assert not changes, f"an hour with nothing happening changed: {changes}"
        after = {j.id: (j.phase, list(j.held)) for j in probe.state.live.values()}
        assert before == after


def check_no_reclaim_cycle(events: Sequence[Event], state: ClusterState) -> None:
    """No cycle of reclaims while the cluster settles after one step: a job taking GPUs back
    from a job that took them from it, directly or through others (b3 took from a7, a7 from
    b3: GPUs going round, which rule 5's checks exist to prevent). Projects taking turns are
    not a cycle: a project within its quota may reclaim from b, and b then from that project's
    other job that holds more than its quota (a 5,000-example soak found such a pair, each
    reclaim allowed by rule 5)."""
    took_from: dict[str, set[str]] = {}  # claimant job -> jobs it reclaimed from
    said: list[str] = []
    for event in events:
        if not (isinstance(event, JobPreemptionRequested) and event.reason == "reclaim"):
            continue
        claimant, victim = event.for_job or "", event.job_id
        took_from.setdefault(claimant, set()).add(victim)
        said.append(
            f"{claimant} ({state.jobs[claimant].project}) took from {victim} "
            f"({state.jobs[victim].project})"
        )
        # a path victim -> ... -> claimant in "reclaimed from" closes a cycle
        seen, todo = set(), [victim]
        while todo:
            job = todo.pop()
            assert job != claimant, f"a cycle of reclaims through {claimant}: {said}"
            if job not in seen:
                seen.add(job)
                todo.extend(took_from.get(job, ()))


def check_indexes(state: ClusterState) -> None:
    """What a cycle reads instead of every job: who holds each GPU (`owners`) and for whom
    GPUs are held (`reserved`) are the live jobs' replicas and nominations, and `live` is in
    submission order (victims are ordered newest first by it)."""
    held: dict[str, dict[int, str]] = {}
    nominated: dict[str, dict[int, str]] = {}
    for job in state.live.values():
        for r in job.held:
            held.setdefault(r.node, {}).update(dict.fromkeys(r.gpus, job.id))
        for r in job.nomination:
            nominated.setdefault(r.node, {}).update(dict.fromkeys(r.gpus, job.id))

    def given(index: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
        return {node: gpus for node, gpus in index.items() if gpus}  # 0-GPU jobs hold none

    assert given(state.owners) == given(held), "owners is not the jobs' held"
    assert given(state.reserved) == given(nominated), "reserved is not the jobs' nominations"
    seqs = [job.seq for job in state.live.values()]
    assert seqs == sorted(seqs), "live is not in submission order"


def check_plan(state: ClusterState, events: Sequence[Event]) -> None:
    """Checks on one cycle's decisions as they are made, applied one by one to a copy of the
    state: gangs are whole at decision time (each replica all its GPUs, a placement at least
    the job's minimum and no more than its replicas), and no victim of a preemption could have
    been spared (without it, the job would still fit on idle, releasing and the other
    victims' GPUs)."""
    probe = copy.deepcopy(state)
    for i, event in enumerate(events):
        if isinstance(event, JobScheduled | JobNominated):
            job = probe.jobs[event.job_id]
            assert all(len(r.gpus) == job.gpus for r in event.replicas), f"{event.id}: short"
            count = len(event.replicas) + (len(job.held) if job.phase != "pending" else 0)
            assert count <= job.replicas, f"{event.id}: {count} replicas of {job.replicas}"
            if job.phase == "pending" and not (isinstance(event, JobScheduled) and event.scale_up):
                assert count >= job.min_replicas, f"{event.id}: {count} < {job.min_replicas}"
            if isinstance(event, JobNominated) and event.victims:
                check_victims_needed(probe, event, events[i + 1 :])
        probe.apply(event)


def check_victims_needed(
    probe: ClusterState, nomination: JobNominated, rest: Sequence[Event]
) -> None:
    job = probe.jobs[nomination.job_id]
    terms = (
        probe.projects[job.project].in_pool(nomination.pool)
        if job.project in probe.projects
        else None
    )
    if nomination.reason == "priority" and terms is not None and terms.limit is not None:
        return  # victims may be needed to get under the limit, not only to fit
    stops = {
        e.job_id: e.replicas
        for e in rest
        if isinstance(e, JobPreemptionRequested) and e.causation == nomination.id
    }
    replicas = len(nomination.replicas)
    ports = job.spec.host_ports()
    taken = probe.ports_taken(but=job.id)
    for spared in stops:
        avail = available_gpus(
            probe, nomination.pool, {v: k for v, k in stops.items() if v != spared}
        )
        if ports:  # a victim's ports are never counted on: only nodes where they are free
            avail = {n: a for n, a in avail.items() if not set(ports) & set(taken.get(n, {}))}
            if job.node is not None:
                avail = {n: a for n, a in avail.items() if n == job.node}
            room = sum(1 for a in avail.values() if a >= job.gpus)
        elif job.node is not None:
            room = avail.get(job.node, 0) // job.gpus if job.gpus else replicas
        else:
            room = sum(n // job.gpus for n in avail.values()) if job.gpus else replicas
        assert room < replicas, f"{nomination.id}: victim {spared} was not needed"


def available_gpus(state: ClusterState, pool: str, victims: dict[str, int]) -> dict[str, int]:
    """Per node of the pool: GPUs idle, being given back, or freed by these victims (job ->
    replicas to stop, 0 for all), and not held for anyone."""
    freed: set[tuple[str, int]] = set()
    for job_id, count in victims.items():
        victim = state.jobs[job_id]
        active = len(victim.held) - victim.stop_replicas
        for r in victim.held[:active] if count == 0 else victim.held[active - count : active]:
            freed.update((r.node, g) for g in r.gpus)
    avail: dict[str, int] = {}
    for node in state.nodes.values():
        if node.pool != pool:
            continue
        owners = state.owners.get(node.name, {})
        reserved = state.reserved.get(node.name, {})
        avail[node.name] = sum(
            1
            for g in range(node.gpus)
            if g not in reserved
            and (
                g not in owners
                or state._giving_back(owners[g], node.name, g)
                or (node.name, g) in freed
            )
        )
    return avail


def fits_idle(state: ClusterState, job: Job, pool: str) -> bool:
    nodes = [n for n in state.nodes.values() if n.pool == pool]
    if job.node is not None:
        nodes = [n for n in nodes if n.name == job.node]
    if not nodes:
        return False
    ports = job.spec.host_ports()
    if ports:  # one replica a node, on nodes where its host ports are free
        taken = state.ports_taken(but=job.id)
        room = 0
        for node in nodes:
            busy = set(state.owners.get(node.name, {})) | set(state.reserved.get(node.name, {}))
            free = node.gpus - len(busy)
            room += free >= job.gpus and not set(ports) & set(taken.get(node.name, {}))
        return room >= job.min_replicas
    if job.gpus == 0:
        return True
    slots = 0
    for node in nodes:
        busy = set(state.owners.get(node.name, {})) | set(state.reserved.get(node.name, {}))
        slots += (node.gpus - len(busy)) // job.gpus
    return slots >= job.min_replicas


def gate_open(state: ClusterState, job: Job, pool: str) -> bool:
    """Rule 3's gates in the pool's scheduler: the limit (fair_share, round_robin) and, for
    non-preemptible work, the quota (fair_share)."""
    kind = state.pool_settings(pool).type
    if kind == "priority":
        return True
    terms = state.projects[job.project].in_pool(pool) if job.project in state.projects else None
    used = np_used = 0
    for other in state.live.values():
        gpus = 0
        if other.pool == pool and other.phase in HOLDING_PHASES:
            gpus += len(other.held) * other.gpus
        if other.nomination_pool == pool:
            gpus += len(other.nomination) * other.gpus
        if other.project == job.project:
            used += gpus
            np_used += 0 if other.preemptible else gpus
    want = job.gpus * job.min_replicas
    if terms is not None and terms.limit is not None and used + want > terms.limit:
        return False
    quota = terms.quota if terms is not None else 0
    return not (kind == "fair_share" and not job.preemptible and np_used + want > quota)


#: Examples per run: about 30 s on two cores. A longer soak: FAIRLANE_POLICY_EXAMPLES=5000.
EXAMPLES = int(os.environ.get("FAIRLANE_POLICY_EXAMPLES", "250"))

PolicyMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_policy_invariants = PolicyMachine.TestCase


# -- found by the properties above --------------------------------------------------------------


def test_a_job_grown_in_a_cycle_is_not_preempted_in_it() -> None:
    """Regression: one cycle gave an elastic job an extra replica on an idle GPU and then, in
    its preemption pass, reclaimed the whole job for another project (the new replica was not
    even a surplus unit yet). Once its project was back within quota the job reclaimed its
    GPUs, grew again, and so on at one instant for ever: settle() raised NotSettled at t=60."""
    vc = VirtualCluster()
    settings_ = SchedulerSettings(fitting="worst")
    vc.configure(
        ClusterConfigured(
            id="c", time=0.0, actor="t", settings=ClusterSettings(scheduler=settings_)
        )
    )
    vc.add_pool("default")
    for name, gpus in (("n0", 2), ("n1", 2), ("n2", 4)):
        vc.add_node(name, "default", gpus)
    vc.set_project("a", {"default": ProjectTerms(quota=4, over_quota_weight=0, priority=50)})
    vc.set_project("b", {})
    vc.submit("elastic", JobSpec(project="a", gpus=1, replicas=3, min_replicas=2, node="n2"))
    vc.submit("pair", JobSpec(project="a", gpus=2, node="n1"))
    vc.submit("gang", JobSpec(project="b", gpus=1, replicas=3, node="n2"))
    vc.submit("short", JobSpec(project="a", gpus=1, duration_s=60))
    vc.settle()
    vc.advance(120)
    assert decide(vc.state, vc.now).events == []
    phases = {j.id: (j.phase, len(j.held)) for j in vc.state.jobs.values()}
    assert phases == {
        "elastic": ("running", 3),
        "pair": ("running", 1),
        "gang": ("pending", 0),  # b may take only the elastic job's surplus: too little on n2
        "short": ("completed", 0),
    }


def test_a_job_on_a_lost_node_is_asked_to_stop_once() -> None:
    """Regression: in the cycle that asked a job to stop because one of its nodes was lost, a
    reclaim picked the same job as its victim and asked it to stop a second time, for
    `reclaim` (the fold dropped that request: the job had stopped already). Its GPUs may still
    be held for the claimant; the only stop request is the node_lost one. Since rule 7, the
    GPU it gives back on n2 counts as free: the claimant waits for it and names no victim."""
    vc = VirtualCluster()
    vc.add_pool("default")
    for name in ("n0", "n1", "n2"):
        vc.add_node(name, "default", 1)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.set_project("b", {"default": ProjectTerms(quota=0)})
    vc.submit("other", JobSpec(project="b", gpus=1))
    vc.submit("gang", JobSpec(project="b", gpus=1, replicas=2))
    vc.settle()
    assert [r.node for r in vc.state.jobs["gang"].held] == ["n1", "n2"]
    start = len(vc.log)
    vc.submit("claim", JobSpec(project="a", gpus=1))
    vc.remove_node("n1")  # in the same cycle as the claim
    vc.settle()
    stops = [(e.job_id, e.reason) for e in vc.log[start:] if isinstance(e, JobPreemptionRequested)]
    assert stops == [("gang", "node_lost")]
    nominated = [e for e in vc.log[start:] if isinstance(e, JobNominated)]
    assert [(e.job_id, e.victims, e.replicas) for e in nominated] == [
        ("claim", (), (Replica("n2", (0,)),))
    ]
    assert {j.id: j.phase for j in vc.state.jobs.values()} == {
        "other": "running",
        "gang": "pending",
        "claim": "running",
    }


def test_in_project_preemption_over_fair_share_is_not_made() -> None:
    """Found by settled_stays_settled (it cycled for ever before rule 4 said otherwise): when
    `low`'s min_runtime runs out, `high` (same project, higher priority) could preempt it and
    take 2 idle GPUs besides, which would put a over its fair share (5 > 4); b's `gang` would
    reclaim `high`, `low` would reclaim `gang`, and round it would go. Rule 4: a preemption
    that leaves the project above its fair share is not made, so nothing moves."""
    vc = VirtualCluster()
    vc.add_pool("default")
    for name, gpus in (("n0", 3), ("n1", 1), ("n2", 4)):
        vc.add_node(name, "default", gpus)
    vc.set_project("a", {"default": ProjectTerms(quota=4, over_quota_weight=0)})
    vc.set_project("b", {"default": ProjectTerms(over_quota_weight=3)})
    vc.set_project("d", {})
    vc.submit("fill", JobSpec(project="d", gpus=3, node="n0"))  # n0 has no room for 2 GPUs
    vc.submit("base", JobSpec(project="a", gpus=1, node="n1"))
    vc.submit(
        "low", JobSpec(project="a", gpus=1, replicas=2, priority=40, node="n2", min_runtime_s=600)
    )
    vc.submit("high", JobSpec(project="a", gpus=2, replicas=2, priority=50))
    vc.submit("gang", JobSpec(project="b", gpus=1, replicas=3, node="n2"))
    vc.settle()
    vc.advance(601)  # the first round: high preempts low, gang reclaims high, low reclaims gang
    start = len(vc.log)
    vc.advance(3600)  # nothing finishes: nothing should move
    moved = [
        (e.time, e.job_id, e.reason)
        for e in vc.log[start:]
        if isinstance(e, JobPreemptionRequested)
    ]
    assert moved == []


def test_a_reclaim_that_leaves_the_victims_project_under_quota_is_not_made() -> None:
    """Found by settled_stays_settled in a soak (FAIRLANE_POLICY_EXAMPLES=1500): an endless
    ping-pong under the earlier reading of rule 5.

    b's `b3` (8 GPUs, all of n0) could reclaim a's `a7` and `a5`: a holds 3, more than its
    quota and fair share of 1, before each victim is taken. That would leave a with 0, under
    its quota, while `a7` (1 GPU) fits within that quota again: `a7` (pinned to n0) would
    reclaim `b3` straight back, the 7 GPUs freed would let `a5` borrow again, and round it
    would go. Rule 5 now forbids such a set of victims when the claimant is above its quota:
    once `a7` has taken n0 back from `b3`, `b3` waits."""
    vc = VirtualCluster()
    vc.add_pool("p0")
    vc.add_node("n0", "p0", 8)
    vc.add_node("n1", "p0", 4)
    vc.set_project("a", {"p0": ProjectTerms(quota=1, over_quota_weight=0, priority=50)})
    vc.set_project("b", {})
    vc.submit("b1", JobSpec(project="b", gpus=3))
    vc.submit("b3", JobSpec(project="b", gpus=8))
    vc.submit("a5", JobSpec(project="a", gpus=2))
    vc.submit("a7", JobSpec(project="a", gpus=1, node="n0"))
    vc.settle()
    phases = {j.id: j.phase for j in vc.state.jobs.values()}
    assert phases == {"b1": "running", "b3": "pending", "a5": "running", "a7": "running"}

    def preemptions() -> list[tuple[str, str | None]]:
        return [(e.job_id, e.for_job) for e in vc.log if isinstance(e, JobPreemptionRequested)]

    # a within its quota takes n0 back from b3 once (rule 5), and b3 does not take it back
    assert preemptions() == [("b3", "a7")]
    vc.advance(3600)
    assert preemptions() == [("b3", "a7")]
