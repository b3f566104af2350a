"""The work relay as a pure function: each node's executor, folding only the relays written for
its node, knows exactly what the whole fold knows about the jobs holding replicas there."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    Event,
    JobScheduled,
    JobSpec,
    NodeLost,
    ProjectTerms,
    Replica,
    WorkRelayed,
    decode_event,
    encode_event,
    subject_for,
)
from policy.state import ClusterState
from services.executor.nodework import NodeWork
from services.nodewatch.work import RelayQueue, WorkBook, oversized, relay_id
from simulation.virtual_cluster import VirtualCluster

NODES = ("n0", "n1", "n2")


def relay_all(
    log: list[Event], check_each: bool = True
) -> tuple[list[WorkRelayed], dict[str, NodeWork]]:
    """Fold `log` as the node watcher does, writing relays; fold each node's relays as its
    executor does; after every event, each node's work must be the fold's, seen from there."""
    state, book = ClusterState(), WorkBook()
    work = {node: NodeWork(node) for node in NODES}
    relays: list[WorkRelayed] = []
    for seq, event in enumerate(log, start=1):
        verdict = state.apply(event, seq)
        for relay in book.relays(state, seq, event, verdict):
            relays.append(relay)
            work[relay.node].note(relay)
        if check_each:
            assert_agrees(state, work)
    return relays, work


def assert_agrees(state: ClusterState, work: dict[str, NodeWork]) -> None:
    for node, mine in work.items():
        expected = {
            job.id: (job.attempt, job.phase, tuple(job.held), job.stop_replicas, job.spec)
            for job in state.live.values()
            if any(r.node == node for r in job.held)
        }
        known = {
            j.job_id: (j.attempt, j.phase, j.held, j.stop_replicas, j.spec)
            for j in mine.jobs.values()
        }
        assert known == expected, node
    # every replica's executor knows the same rendezvous for the attempt, and no two jobs
    # holding replicas meet at the same address and port
    meets: dict[str, set[tuple[int, str, int]]] = {}
    for mine in work.values():
        for j in mine.jobs.values():
            assert j.rendezvous is not None and j.rendezvous.attempt == j.attempt, j.job_id
            meets.setdefault(j.job_id, set()).add(
                (j.rendezvous.attempt, j.rendezvous.address, j.rendezvous.port)
            )
    assert all(len(m) == 1 for m in meets.values()), meets
    places = [(address, port) for m in meets.values() for _, address, port in m]
    assert len(places) == len(set(places)), places


def cluster() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("default")
    for node in NODES:
        vc.add_node(node, "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=3)})
    vc.set_project("b", {"default": ProjectTerms(quota=3)})
    return vc


#: What `ACTIONS` draws: a submission (project, priority class, GPUs, replicas, elastic), a
#: verb on the n-th job submitted, a node lost, seconds passing.
Action = (
    tuple[str, str, str, int, int, bool] | tuple[str, int] | tuple[str, str] | tuple[str, float]
)

ACTIONS: st.SearchStrategy[list[Action]] = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from(["a", "b"]),
            st.sampled_from(["train", "build", "inference"]),
            st.integers(1, 2),  # gpus
            st.integers(1, 3),  # replicas
            st.booleans(),  # elastic
        ),
        st.tuples(
            st.sampled_from(["complete", "fail", "pause", "resume", "cancel"]), st.integers(0, 20)
        ),
        st.tuples(st.just("lose"), st.sampled_from(NODES)),
        st.tuples(st.just("advance"), st.floats(1, 100)),
    ),
    max_size=25,
)


def play(actions: list[Action]) -> VirtualCluster:
    vc = cluster()
    submitted: list[str] = []
    lost: set[str] = set()
    for action in actions:
        match action:
            case ("submit", project, klass, gpus, replicas, elastic):
                job_id = f"j{len(submitted)}"
                submitted.append(job_id)
                spec = JobSpec(
                    project=str(project),
                    priority_class=str(klass),
                    gpus=int(gpus),
                    replicas=int(replicas),
                    min_replicas=1 if elastic else None,
                    command=("sleep", "9"),
                    env=(f"JOB={job_id}",),
                )
                vc.submit(job_id, spec)
            case ("lose", node) if node not in lost:
                lost.add(str(node))
                vc.remove_node(str(node))
            case ("advance", seconds):
                vc.advance(float(seconds))
            case (verb, index) if submitted and isinstance(index, int):
                job_id = submitted[index % len(submitted)]
                getattr(vc, str(verb))(job_id)
        vc.settle()
    return vc


@settings(max_examples=200, deadline=None)
@given(ACTIONS)
def test_each_node_folding_its_own_relays_knows_what_the_fold_knows_of_its_jobs(
    actions: list[Action],
) -> None:
    vc = play(actions)
    relays, _ = relay_all(vc.log)
    # one relay per node per event, each on the node's own subject, readable as written
    assert len({r.id for r in relays}) == len(relays)
    for relay in relays:
        assert subject_for(relay) == f"fl-work.{relay.node}"
        assert decode_event(encode_event(relay)) == relay
        assert relay.id == relay_id(relay.node, relay.source_seq)


def test_a_placement_carries_the_spec_and_goes_only_to_its_nodes() -> None:
    vc = cluster()
    vc.submit("j", JobSpec(project="a", gpus=2, replicas=2, command=("run",)))
    vc.settle()
    relays, work = relay_all(vc.log)
    [placed_on_0, placed_on_1] = [r for r in relays if isinstance(r.event, JobScheduled)]
    assert (placed_on_0.node, placed_on_1.node) == ("n0", "n1")
    assert placed_on_0.jobs[0].spec == JobSpec(project="a", gpus=2, replicas=2, command=("run",))
    assert not work["n2"].relays  # nothing of it reached the node it does not run on
    assert work["n0"].scheduled["j"] == placed_on_0.event.id


def test_a_refused_placement_is_never_relayed() -> None:
    vc = cluster()
    vc.submit("j1", JobSpec(project="a", gpus=2))
    vc.submit("j2", JobSpec(project="a", gpus=2))
    vc.settle()
    holder = vc.state.jobs["j1"].held[0]
    stale = JobScheduled(
        id="stale",
        time=0.0,
        actor="deposed",
        job_id="j2",
        attempt=1,
        pool="default",
        replicas=(holder,),
    )
    vc.record(stale)  # the GPUs are j1's: the fold refuses it
    relays, work = relay_all(vc.log)
    assert not [r for r in relays if r.event.id == "stale"]
    assert set(work[holder.node].jobs) == {"j1"}


def test_a_lost_node_is_told_and_so_are_the_nodes_sharing_its_jobs() -> None:
    vc = cluster()
    vc.submit("gang", JobSpec(project="a", gpus=2, replicas=2, priority_class="train"))
    assert vc.settle() and len(vc.state.jobs["gang"].held) == 2
    vc.remove_node("n0")
    relays, work = relay_all(vc.log)
    told = {r.node: r for r in relays if isinstance(r.event, NodeLost)}
    assert set(told) == {"n0", "n1"}  # n2 runs nothing of it
    assert [j.held for j in told["n1"].jobs] == [(Replica("n1", (0, 1)),)]
    assert "gang" not in work["n0"].jobs


def test_the_relay_is_its_source_time_so_no_fold_moves_by_it() -> None:
    vc = cluster()
    vc.submit("j", JobSpec(project="a"))
    vc.settle()
    relays, _ = relay_all(vc.log)
    state = ClusterState()
    for seq, event in enumerate(vc.log, start=1):
        state.apply(event, seq)
    before = msgspec.structs.asdict(state.jobs["j"])
    for relay in relays:
        assert state.apply(relay).applied  # ignored: no handler, no refusal
    assert msgspec.structs.asdict(state.jobs["j"]) == before


def test_a_new_leader_has_pending_only_what_the_relay_stream_does_not_hold() -> None:
    vc = cluster()
    for i in range(4):
        vc.submit(f"j{i}", JobSpec(project="a"))
    vc.settle()
    relays, _ = relay_all(vc.log, check_each=False)
    written = relays[: len(relays) // 2]
    # a new leader reads the relay stream (what its predecessor wrote) before the log
    state, book, queue = ClusterState(), WorkBook(), RelayQueue()
    for relay in written:
        queue.seen(relay)
    for seq, event in enumerate(vc.log, start=1):
        queue.add(book.relays(state, seq, event, state.apply(event, seq)))
    assert queue.after(None, 10_000) == relays[len(written) :]
    # and a leader that wrote some of those resumes after the last it wrote
    assert queue.after((relays[-2].source_seq, relays[-2].node), 10) == relays[-1:]


def test_a_relay_read_back_ahead_of_the_fold_is_never_handed_out_again() -> None:
    vc = cluster()
    for i in range(4):
        vc.submit(f"j{i}", JobSpec(project="a"))
    vc.settle()
    relays, _ = relay_all(vc.log, check_each=False)
    queue = RelayQueue()
    queue.add(relays)  # the fold computed them all
    # another leader's relays to one node are read back, the last one first as it may be
    # (each node's are written in log order: the last means all before it were written)
    node = relays[0].node
    mine = [r for r in relays if r.node == node]
    queue.seen(mine[-1])
    assert queue.after(None, 10_000) == [r for r in relays if r.node != node]
    assert all(r.node != node for r in queue.pending.values())  # dropped, not kept
    queue.add(mine)  # a fold behind the relay stream computes them again: not queued
    assert all(r.node != node for r in queue.pending.values())


def test_work_for_another_node_is_refused() -> None:
    relay = WorkRelayed(
        id="x",
        time=0.0,
        actor="nodewatch",
        node="n1",
        source_seq=1,
        event=NodeLost(id="l", time=0.0, actor="t", node="n1"),
    )
    with pytest.raises(ValueError, match="'n1'"):
        NodeWork("n0").note(relay)


def test_a_relay_written_again_is_noted_once() -> None:
    vc = cluster()
    vc.submit("j", JobSpec(project="a"))
    vc.settle()
    relays, _ = relay_all(vc.log)
    work = NodeWork(relays[0].node)
    mine = [r for r in relays if r.node == work.node]
    assert all(work.note(r) for r in mine)
    assert not any(work.note(r) for r in mine)  # past the stream's duplicate window, say
    assert work.relays == len(mine)


def test_a_relay_larger_than_the_bus_carries_is_named_and_dropped_once_set_aside() -> None:
    assert oversized(1000, 1024 * 1024) is None
    said = oversized(1024 * 1024, 1024 * 1024)
    assert said is not None and "1048576 bytes" in said and "max_payload" in said
    vc = cluster()
    vc.submit("j0", JobSpec(project="a"))
    vc.settle()
    relays, _ = relay_all(vc.log, check_each=False)
    queue = RelayQueue()
    queue.add(relays)
    queue.drop(relays[0].id)  # its EventSetAside read back: never to be written
    assert queue.after(None, 10_000) == relays[1:]
