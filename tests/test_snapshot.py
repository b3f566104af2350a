"""A snapshot plus the tail folds to exactly the state (and the decisions) of the whole log.

The logs are the scenario suite's, played on the core engine: every rule of the policy, gangs,
elastic jobs, nominations, lost nodes and pauses among them. Each log is cut at several points;
the state up to the cut goes through bytes, the rest is folded on top, and the result must be
the straight fold's, byte for byte, with the same decisions at the same time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from events import Event, decode_event, encode_event
from policy.cycle import decide
from policy.snapshot import (
    FOLD_VERSION,
    SnapshotMismatch,
    _Snapshot,
    decode_snapshot,
    encode_snapshot,
    snapshot_seq,
)
from policy.state import ClusterState
from simulation.scenario.core_engine import CoreEngine
from simulation.spec import load_scenario

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


def scenario_log(path: Path) -> tuple[list[Event], float]:
    scenario = load_scenario(path)
    engine = CoreEngine(scenario)
    for step in scenario.steps:
        engine.step(step)
    return list(engine.vc.log), engine.vc.now


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_snapshot_and_the_tail_fold_to_the_whole_log(path: Path) -> None:
    log, now = scenario_log(path)
    straight = ClusterState()
    straight.apply_all(log)
    for cut in sorted({0, 1, len(log) // 3, len(log) // 2, len(log) - 1, len(log)}):
        head = ClusterState()
        head.apply_all(log[:cut])
        restored, seq = decode_snapshot(encode_snapshot(head, cut))
        assert seq == cut
        restored.apply_all(log[cut:])
        assert encode_snapshot(restored, 0) == encode_snapshot(straight, 0), f"cut at {cut}"
        assert decide(restored, now) == decide(straight, now), f"cut at {cut}"
        assert decide(restored, now + 3600) == decide(straight, now + 3600)


def test_live_shares_its_jobs_with_jobs_after_a_restore() -> None:
    log, _ = scenario_log(SCENARIOS[0])
    state = ClusterState()
    state.apply_all(log)
    restored, _ = decode_snapshot(encode_snapshot(state, len(log)))
    assert restored.live
    for job_id, job in restored.live.items():
        assert restored.jobs[job_id] is job


def test_every_field_of_the_fold_is_in_the_snapshot() -> None:
    """A field added to `ClusterState` must be added to the snapshot too (a `Job` is written
    whole, as the struct it is). Only what is made again from the jobs is left out."""
    fields = dataclasses.fields(ClusterState)
    state_fields = {f.name.lstrip("_") for f in fields if not f.metadata.get("derived")}
    assert state_fields == set(_Snapshot.__struct_fields__)


def test_a_snapshot_of_another_fold_version_is_refused() -> None:
    data = encode_snapshot(ClusterState(), 7)
    assert snapshot_seq(data) == 7
    length = int.from_bytes(data[:4], "big")
    header = msgspec.msgpack.decode(data[4 : 4 + length])
    header[1] = FOLD_VERSION + 1
    other = msgspec.msgpack.encode(header)
    older = len(other).to_bytes(4, "big") + other + data[4 + length :]
    with pytest.raises(SnapshotMismatch, match=f"fold {FOLD_VERSION + 1}"):
        decode_snapshot(older)


def test_bytes_that_are_no_snapshot_are_refused() -> None:
    with pytest.raises(SnapshotMismatch, match="not a snapshot"):
        decode_snapshot(b"\x00garbage")
    cut_short = encode_snapshot(ClusterState(), 7)[:-3]
    with pytest.raises(SnapshotMismatch, match="damaged snapshot"):
        decode_snapshot(cut_short)


def _name_objects(state: ClusterState) -> tuple[int, int, int, int]:
    """Distinct node names and GPU index lists among the live jobs' replicas, by value and as
    objects."""
    replicas = [r for job in state.live.values() for r in (*job.held, *job.nomination)]
    return (
        len({r.node for r in replicas}),
        len({id(r.node) for r in replicas}),
        len({r.gpus for r in replicas}),
        len({id(r.gpus) for r in replicas}),
    )


def test_replicas_decoded_from_the_log_or_a_snapshot_share_their_names() -> None:
    """Every replica decoded from an event or a snapshot brings a node name and a GPU list of
    its own; the fold keeps one object for each value (`ClusterData.shared`), which a cycle
    reads for every victim."""
    path = next(p for p in SCENARIOS if p.stem == "elastic-extras-nominated-as-the-minimum-starts")
    log, _ = scenario_log(path)
    state = ClusterState()
    state.apply_all([decode_event(encode_event(e)) for e in log])
    names, name_objects, gpu_lists, gpu_list_objects = _name_objects(state)
    assert state.live and names == name_objects and gpu_lists == gpu_list_objects
    restored, _ = decode_snapshot(encode_snapshot(state, len(log)))
    assert _name_objects(restored) == (names, names, gpu_lists, gpu_lists)
