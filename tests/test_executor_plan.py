"""The executor's planner as a pure function: the node's work and what runs here in, actions out."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobPreemptionRequested,
    JobSpec,
    NodeRegistered,
    Replica,
    WorkRelayed,
)
from events.catalogue import JobWork
from services.executor.facts import AttemptFacts, Here, ReplicaFacts
from services.executor.nodework import NodeWork, requested
from services.executor.plan import (
    KILL_WAIT_S,
    Action,
    Forget,
    Kill,
    Register,
    Report,
    Start,
    Store,
    Terminate,
    plan,
)

GRACE = 10.0
SPEC = JobSpec(project="a", gpus=1, command=("run",))
PAIR = (Replica("n0", (0,)), Replica("n1", (0,)))


def work(node: str, *jobs: JobWork) -> NodeWork:
    w = NodeWork(node)
    for job in jobs:
        w.jobs[job.job_id] = job
        w.scheduled[job.job_id] = f"{job.job_id}/placed"
        w.firsts[job.job_id] = job.held[0].node
    return w


def job(phase: str = "running", held: tuple[Replica, ...] = PAIR, stop: int = 0) -> JobWork:
    return JobWork(
        job_id="g", attempt=1, phase=phase, held=held, stop_replicas=stop, grace_s=GRACE, spec=SPEC
    )


def asked(w: NodeWork) -> NodeWork:
    """The whole job asked to stop, as the relay of the request leaves it."""
    stopping = w.jobs["g"]
    request = JobPreemptionRequested(
        id="g/ask", time=0.0, actor="p", job_id="g", attempt=1, reason="priority"
    )
    w.jobs["g"] = msgspec.structs.replace(stopping, stop_replicas=len(stopping.held))
    w.stops["g"] = [requested(request, w.jobs["g"])]
    return w


def here(node: str = "n0", *replicas: ReplicaFacts, **kw: object) -> Here:
    attempts = {r.attempt_key: AttemptFacts(r.job_id, r.attempt) for r in replicas}
    return Here(
        node=node,
        actor=f"executor/{node}",
        boot_id="b",
        objects=True,
        attempts=attempts,
        replicas={r.key: r for r in replicas},
        **kw,  # type: ignore[arg-type]
    )


def running(node: str = "n0", index: int = 0, **kw: object) -> ReplicaFacts:
    return ReplicaFacts(
        "g",
        1,
        index,
        PAIR[index] if node == PAIR[index].node else Replica(node, (0,)),
        launched=True,
        has_workload=True,
        **kw,  # type: ignore[arg-type]
    )


def reports(actions: list[Action]) -> list[object]:
    return [a.event for a in actions if isinstance(a, Report)]


def test_a_placement_starts_the_replicas_here_and_the_first_node_announces() -> None:
    w = work("n0", job("starting"))
    [start] = plan(w, here("n0"), 0.0)
    assert isinstance(start, Start)
    assert (start.index, start.replica, start.announce) == (0, PAIR[0], True)
    assert start.scheduled_id == "g/placed"
    [other] = plan(work("n1", job("starting")), here("n1"), 0.0)
    assert isinstance(other, Start) and (other.index, other.announce) == (1, False)


def test_a_stop_signals_then_kills_then_stores_then_reports_its_own_replicas() -> None:
    w = asked(work("n1", job()))
    r = running("n1", 1)
    assert plan(w, here("n1", r), 0.0) == [Terminate(r.key, GRACE)]
    termed = dataclasses.replace(r, stop_at=0.0)
    assert plan(w, here("n1", termed), GRACE - 0.1) == []
    assert plan(w, here("n1", termed), GRACE) == [Kill(r.key)]
    ended = dataclasses.replace(termed, killed=True, ended=True, exit_code=137)
    assert plan(w, here("n1", ended), GRACE + 1) == [Store(r.key, after_stop=True)]
    assert plan(w, here("n1", dataclasses.replace(ended, storing=True)), GRACE + 1) == []
    stored = dataclasses.replace(ended, stored_after_stop=True, stored_bytes=7)
    [event] = reports(plan(w, here("n1", stored), GRACE + 2))
    assert isinstance(event, JobPreempted)
    # n1 is not the stop's first node: its report is its own, under the stop's id and its name
    assert (event.id, event.node, event.own_replicas) == ("g/ask/done/n1", "n1", True)
    assert (event.killed, event.stored_bytes, event.causation) == (True, 7, "g/ask")
    first = asked(work("n0", job()))
    done = dataclasses.replace(running("n0", 0), stop_at=0.0, ended=True, stored_after_stop=True)
    [mine] = reports(plan(first, here("n0", done), 1.0))
    assert isinstance(mine, JobPreempted) and mine.id == "g/ask/done"  # as a single reporter's


def test_a_replica_that_ends_by_itself_is_reported_failed_or_completed() -> None:
    w = work("n0", job(held=(PAIR[0],)))
    failed = dataclasses.replace(running(), ended=True, exit_code=3, detail="boom")
    [event] = reports(plan(w, here("n0", failed), 1.0))
    assert isinstance(event, JobFailed)
    assert (event.id, event.reason) == ("g/1/failed", "replica 0 on n0 exited with code 3: boom")
    ok = dataclasses.replace(running(), ended=True, exit_code=0)
    [event] = reports(plan(w, here("n0", ok), 1.0))
    assert isinstance(event, JobCompleted) and event.id == "g/1/completed"
    # reported already (or being reported): nothing more
    assert plan(w, here("n0", ok, reported=frozenset({"g/1/completed"})), 1.0) == []


def test_a_save_over_the_bound_is_reported_with_the_size_refused() -> None:
    """The store refused the folder: `JobCheckpointed` gives the refused size and says so,
    not the size of the object stored before it."""
    w = work("n0", job(held=(PAIR[0],)))
    r = running(size=90_000, refused=True)
    h = here("n0", r)
    h = dataclasses.replace(h, attempts={r.attempt_key: AttemptFacts("g", 1, mark=5.0)})
    [event] = reports(plan(w, h, 6.0))
    assert isinstance(event, JobCheckpointed)
    assert (event.size_bytes, event.refused, event.time) == (90_000, True, 5.0)
    kept = dataclasses.replace(h, replicas={r.key: dataclasses.replace(r, refused=False)})
    [event] = reports(plan(w, kept, 6.0))
    assert isinstance(event, JobCheckpointed) and not event.refused


def test_what_the_log_no_longer_wants_is_stopped_without_a_report_then_forgotten() -> None:
    w = work("n0")  # the job ended elsewhere: nothing holds n0
    r = running()
    assert plan(w, here("n0", r), 0.0) == [Terminate(r.key, 30.0)]
    gone = dataclasses.replace(r, stop_at=0.0, ended=True)
    assert plan(w, here("n0", gone), 1.0) == [Forget(r.key)]


def test_a_lost_node_registers_again_once_emptied() -> None:
    offer = NodeRegistered(id="n0/registered/b", time=0.0, actor="e", node="n0", pool="p", gpus=1)
    lost = here("n0", running(), lost=True, offer=offer)
    assert not any(isinstance(a, Register) for a in plan(work("n0"), lost, 0.0))
    empty = here("n0", lost=True, offer=offer)
    [register] = plan(work("n0"), empty, 0.0)
    assert isinstance(register, Register) and register.event.id == "n0/registered/b/1"


# -- properties ------------------------------------------------------------------------------


def bookkeep(h: Here, actions: list[Action], now: float) -> Here:
    """What the actuator records as it takes each action (what happens after is the test's)."""
    replicas, reported = dict(h.replicas), set(h.reported)
    for a in actions:
        match a:
            case Start(job=j, index=i, replica=r):
                replicas[(j.job_id, j.attempt, r)] = ReplicaFacts(j.job_id, j.attempt, i, r)
            case Terminate(key=k):
                replicas[k] = dataclasses.replace(replicas[k], stop_at=now)
            case Kill(key=k):
                replicas[k] = dataclasses.replace(replicas[k], killed=True)
            case Store(key=k):
                replicas[k] = dataclasses.replace(replicas[k], stored_after_stop=True)
            case Forget(key=k):
                replicas.pop(k)
            case Report(event=e):
                reported.add(e.id)
    return dataclasses.replace(
        h, replicas=replicas, reported=frozenset(reported), published=frozenset(reported)
    )


gangs = st.lists(st.sampled_from(["n0", "n1"]), min_size=1, max_size=4).map(
    lambda nodes: tuple(Replica(n, (i,)) for i, n in enumerate(nodes))
)


@settings(max_examples=200, deadline=None)
@given(held=gangs, phase=st.sampled_from(["starting", "running"]), rounds=st.integers(1, 4))
def test_a_replica_is_never_started_twice(
    held: tuple[Replica, ...], phase: str, rounds: int
) -> None:
    w = work("n0", job(phase, held))
    h = here("n0")
    starts: list[Start] = []
    for step in range(rounds):
        actions = plan(w, h, float(step))
        assert actions == plan(w, h, float(step))  # the same inputs, the same actions
        starts += [a for a in actions if isinstance(a, Start)]
        h = bookkeep(h, actions, float(step))
    keys = [(s.job.job_id, s.replica) for s in starts]
    assert len(keys) == len(set(keys)) == sum(r.node == "n0" for r in held)


@settings(max_examples=200, deadline=None)
@given(
    held=gangs.filter(lambda g: any(r.node == "n0" for r in g)),
    exits_after=st.lists(st.one_of(st.none(), st.floats(0, 2 * GRACE)), min_size=4, max_size=4),
    kill_ends=st.booleans(),
)
def test_every_stop_ends_in_a_report_within_the_grace_and_the_kill_wait(
    held: tuple[Replica, ...], exits_after: list[float | None], kill_ends: bool
) -> None:
    """However the replicas take SIGTERM (exit at once, late, never; SIGKILL ending them or
    not), this node's report of the stop comes by the grace plus KILL_WAIT_S."""
    w = asked(work("n0", job("running", held)))
    mine = [(i, r) for i, r in enumerate(held) if r.node == "n0"]
    h = here("n0", *(ReplicaFacts("g", 1, i, r, launched=True, has_workload=True) for i, r in mine))
    dt, now, reported_at = 0.5, 0.0, None
    while now <= GRACE + KILL_WAIT_S + 2 * dt and reported_at is None:
        h = dataclasses.replace(
            h,
            replicas={
                k: exit_if_due(f, exits_after, kill_ends, now) for k, f in h.replicas.items()
            },
        )
        actions = plan(w, h, now)
        if any(isinstance(a, Report) and a.event.id.startswith("g/ask/done") for a in actions):
            reported_at = now
        h = bookkeep(h, actions, now)
        now += dt
    assert reported_at is not None and reported_at <= GRACE + KILL_WAIT_S + dt


def exit_if_due(
    f: ReplicaFacts, exits_after: list[float | None], kill_ends: bool, now: float
) -> ReplicaFacts:
    if f.ended or f.stop_at is None:
        return f
    after = exits_after[f.index]
    if (after is not None and now >= f.stop_at + after) or (f.killed and kill_ends):
        return dataclasses.replace(f, ended=True, exit_code=143)
    return f


def test_stops_of_some_replicas_are_reported_by_each_node_for_its_own_in_turn() -> None:
    """An elastic job's extras over two nodes, taken by two requests in turn (each the newest
    not taken yet): each node reports its own replicas of each, a node its requests one after
    the other (the fold gives back a node's newest first), the request's first node under the
    request's answer (which counts the preemption), the other under that and its name."""
    four = (Replica("n0", (0,)), Replica("n1", (0,)), Replica("n0", (1,)), Replica("n1", (1,)))
    w1, w0 = work("n1", job(held=four)), work("n0", job(held=four))
    stopping = 0
    for ask, n in (("g/a1", 2), ("g/a2", 1)):
        request = JobPreemptionRequested(
            id=ask, time=0.0, actor="p", job_id="g", attempt=1, reason="reclaim", replicas=n
        )
        for w in (w1, w0):
            w.jobs["g"] = msgspec.structs.replace(w.jobs["g"], stop_replicas=stopping + n)
            w.stops.setdefault("g", []).append(requested(request, w.jobs["g"], stopping))
        stopping += n
    assert [o.targets for o in w1.stops["g"]] == [(four[2], four[3]), (four[1],)]

    def done(node: str, *indexes: int) -> Here:
        facts = [
            ReplicaFacts("g", 1, i, four[i], launched=True, ended=True, stop_at=0.0)
            for i in indexes
        ]
        return dataclasses.replace(here(node, *facts), objects=False)

    def own(events: list[object]) -> list[tuple[str, int, bool]]:
        return [(e.id, e.replicas, e.own_replicas) for e in events if isinstance(e, JobPreempted)]

    assert own(reports(plan(w0, done("n0", 2), 1.0))) == [("g/a1/done", 1, True)]
    n1 = done("n1", 1, 3)
    assert own(reports(plan(w1, n1, 1.0))) == [("g/a1/done/n1", 1, True)]  # a2's waits
    in_flight = dataclasses.replace(n1, reported=frozenset({"g/a1/done/n1"}))
    assert own(reports(plan(w1, in_flight, 1.0))) == []
    logged = dataclasses.replace(in_flight, published=in_flight.reported)
    assert own(reports(plan(w1, logged, 1.0))) == [("g/a2/done", 1, True)]


def test_a_replica_lost_stops_the_attempt_as_a_preemption_does_node_by_node() -> None:
    """A replica that ended unobserved (no exit status): the node stops its other replicas,
    stores and reports its own under `lost` and its name; the others, told by the relay of
    that report, do the same, so the next attempt resumes from what each stored."""
    held = (Replica("n0", (0,)), Replica("n0", (1,)), Replica("n1", (0,)))
    w0 = work("n0", job(held=held))
    gone = ReplicaFacts("g", 1, 0, held[0], launched=True, has_workload=True, ended=True)
    alive = ReplicaFacts("g", 1, 1, held[1], launched=True, has_workload=True)
    assert plan(w0, here("n0", gone, alive), 1.0) == [Terminate(alive.key, GRACE)]
    ended = dataclasses.replace(alive, stop_at=1.0, ended=True, exit_code=143)
    assert plan(w0, here("n0", gone, ended), 2.0) == [
        Store(gone.key, after_stop=True),  # what either saved goes to the store first
        Store(ended.key, after_stop=True),
    ]
    stopped = [dataclasses.replace(f, stored_after_stop=True) for f in (gone, ended)]
    [event] = reports(plan(w0, here("n0", *stopped), 2.0))
    assert isinstance(event, JobPreempted)
    assert (event.id, event.reason, event.own_replicas) == ("g/1/lost/n0", "node_lost", True)
    w1 = work("n1", job(held=held))
    left = job("stopping", held=held[2:], stop=1)
    relay = WorkRelayed(
        id="work/n1/9", time=2.0, actor="w", node="n1", source_seq=9, event=event, jobs=(left,)
    )
    assert w1.note(relay)
    r = running("n1", 0)
    r = dataclasses.replace(r, replica=held[2], index=2)
    assert plan(w1, here("n1", r), 2.0) == [Terminate(r.key, GRACE)]
    over = dataclasses.replace(r, stop_at=2.0, ended=True, exit_code=143, stored_after_stop=True)
    [mine] = reports(plan(w1, here("n1", over), 3.0))
    assert isinstance(mine, JobPreempted)
    assert (mine.id, mine.reason, mine.own_replicas) == ("g/1/lost/n1", "node_lost", True)


def job_of(action: Action) -> str | None:
    """The job an action is of (None: the node's own)."""
    match action:
        case Start(job=j):
            return j.job_id
        case Terminate(key=k) | Kill(key=k) | Store(key=k) | Forget(key=k):
            return k[0]
        case Report(event=e):
            job_id = getattr(e, "job_id", None)
            return job_id if isinstance(job_id, str) else None
    return None


replica_state = st.fixed_dictionaries(
    {
        "here": st.booleans(),
        "launched": st.booleans(),
        "ended": st.booleans(),
        "exit_code": st.sampled_from([None, 0, 3]),
        "stop_at": st.sampled_from([None, 0.0]),
        "killed": st.booleans(),
    }
)
job_state = st.fixed_dictionaries(
    {
        "phase": st.sampled_from(["starting", "running"]),
        "replicas": st.lists(replica_state, min_size=1, max_size=2),
        "asked": st.booleans(),
        "announce": st.booleans(),
        "reported": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(job_state, min_size=1, max_size=4),
    chosen=st.sets(st.integers(0, 4)),
    gone=st.booleans(),
    now=st.sampled_from([0.0, GRACE + 1.0, GRACE + KILL_WAIT_S + 1.0]),
)
def test_a_plan_of_some_jobs_is_the_whole_plan_for_those_jobs(
    jobs: list[dict[str, object]], chosen: set[int], gone: bool, now: float
) -> None:
    """The executor plans only the jobs whose facts changed: what it leaves out of a plan must
    be exactly the other jobs' actions, whatever state each job is in."""
    w = NodeWork("n0")
    facts: list[ReplicaFacts] = []
    attempts: dict[tuple[str, int], AttemptFacts] = {}
    reported: set[str] = set()
    for k, spec in enumerate(jobs):
        job_id = f"j{k}"
        states: list[dict[str, object]] = spec["replicas"]  # type: ignore[assignment]
        held = tuple(Replica("n0", (2 * k + i,)) for i in range(len(states)))
        w.jobs[job_id] = JobWork(
            job_id=job_id, attempt=1, phase=str(spec["phase"]), held=held, grace_s=GRACE, spec=SPEC
        )
        w.scheduled[job_id], w.firsts[job_id] = f"{job_id}/placed", "n0"
        if spec["asked"]:
            ask = JobPreemptionRequested(
                id=f"{job_id}/ask", time=0.0, actor="p", job_id=job_id, attempt=1, reason="priority"
            )
            w.jobs[job_id] = msgspec.structs.replace(w.jobs[job_id], stop_replicas=len(held))
            w.stops[job_id] = [requested(ask, w.jobs[job_id])]
        for i, (state, replica) in enumerate(zip(states, held, strict=True)):
            if state["here"]:
                facts.append(
                    ReplicaFacts(
                        job_id,
                        1,
                        i,
                        replica,
                        launched=bool(state["launched"]),
                        ended=bool(state["ended"]),
                        exit_code=state["exit_code"],  # type: ignore[arg-type]
                        stop_at=state["stop_at"],  # type: ignore[arg-type]
                        killed=bool(state["killed"]),
                        has_workload=True,
                    )
                )
                attempts[(job_id, 1)] = AttemptFacts(job_id, 1, announce=bool(spec["announce"]))
        if spec["reported"]:
            reported.add(f"{job_id}/1/started")
    if gone:  # a job the log no longer holds here, its replica still here
        facts.append(ReplicaFacts("old", 1, 0, Replica("n0", (9,)), launched=True, ended=True))
    h = dataclasses.replace(
        here("n0"),
        attempts=attempts,
        replicas={r.key: r for r in facts},
        reported=frozenset(reported),
        published=frozenset(reported),
    )
    some = {f"j{k}" for k in chosen} | ({"old"} if gone and 4 in chosen else set())
    whole = plan(w, h, now)
    assert plan(w, h, now, some) == [a for a in whole if job_of(a) in some or job_of(a) is None]
    assert plan(w, h, now, None) == whole
