"""A `ClusterState` as bytes, and back: the fold up to a stream sequence, so a service that
restarts replays only the log's tail.

The format is an explicit, versioned msgspec schema, not a pickle of the objects: what is in a
snapshot is decided here, and an old snapshot is refused (`SnapshotMismatch`) instead of being
half-understood. `FOLD_VERSION` names the fold's own meaning: change it whenever the fold
(`state.py` and the modules it joins) would fold the same events into a different state, and
every older snapshot is ignored (the service replays the whole log, as it would without one).

The bytes are a small header (its length in 4 bytes, then format, fold and sequence), so a
snapshot can be checked without decoding it, then the body. Dict orders are part of the state
(the policy breaks ties by them), so they are kept as they are: msgspec writes dicts in
insertion order and reads them back in the same order, and `live` (which shares its jobs with
`jobs`) is written as the ordered list of its ids.
"""

from __future__ import annotations

from typing import Final

import msgspec

from events import ClusterSettings, ProjectTerms, SchedulerSettings, VolumeGrant
from policy.decay import PoolUsage
from policy.state import ClusterState, Job, Node, Pool, Project

#: The meaning of the fold (bump with any change to the fold that changes its results).
#: 5: a placement or nomination of more replicas than a pending job has is refused.
#: 6: cordoned and drained nodes (NodeCordoned, NodeUncordoned): a node's cordon and a job's
#: drain are kept; rule 11's decayed usage per pool with a half-life.
#: 7: a placement or nomination that would publish a host port twice on a node is refused.
#: 8: the volume allowlist (VolumesConfigured), which an older fold skipped.
#: 9: a placement or nomination of non-preemptible work over its project's quota is refused.
#: 10: a placement for an attempt other than the job's next is refused; refused decisions are
#: counted per job (`Job.refusals`).
FOLD_VERSION: Final = 10
#: The layout of this file's structs. 2: the settings as `events.ClusterSettings`.
#: 3: a node's cordon; `usage` (rule 11). 4: `volumes`. 5: a job's `refusals`.
FORMAT_VERSION: Final = 5


class SnapshotMismatch(ValueError):
    """The bytes are not a snapshot this code can use (another format or fold version)."""


class _Pool(msgspec.Struct, array_like=True):
    name: str
    order: int
    scheduler: SchedulerSettings | None


class _Node(msgspec.Struct, array_like=True):
    name: str
    pool: str
    gpus: int
    order: int
    cordoned: bool


class _Project(msgspec.Struct, array_like=True):
    name: str
    order: int
    terms: dict[str, ProjectTerms]


class _Header(msgspec.Struct, array_like=True):
    format: int
    fold: int
    #: The stream sequence of the last event folded in: replay resumes after it.
    seq: int


class _Snapshot(msgspec.Struct):
    settings: ClusterSettings
    pools: list[_Pool]
    nodes: list[_Node]
    projects: list[_Project]
    jobs: list[Job]
    live: list[str]
    owners: dict[str, dict[int, str]]
    reserved: dict[str, dict[int, str]]
    last_time: float
    events_applied: int
    position: int
    held: bool
    node_seq: int
    job_seq: int
    usage: dict[str, PoolUsage] = {}
    volumes: tuple[VolumeGrant, ...] = ()


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(_Snapshot)
_header_decoder: Final = msgspec.msgpack.Decoder(_Header)
_LENGTH_BYTES: Final = 4


def encode_snapshot(state: ClusterState, seq: int) -> bytes:
    """The state, folded up to and including stream sequence `seq`, as bytes."""
    header = _encoder.encode(_Header(FORMAT_VERSION, FOLD_VERSION, seq))
    body = _encoder.encode(
        _Snapshot(
            settings=state.settings,
            pools=[_Pool(p.name, p.order, p.scheduler) for p in state.pools.values()],
            nodes=[
                _Node(n.name, n.pool, n.gpus, n.order, n.cordoned) for n in state.nodes.values()
            ],
            projects=[_Project(p.name, p.order, p.terms) for p in state.projects.values()],
            jobs=list(state.jobs.values()),
            live=list(state.live),
            owners=state.owners,
            reserved=state.reserved,
            last_time=state.last_time,
            events_applied=state.events_applied,
            position=state.position,
            held=state.held,
            node_seq=state._node_seq,
            job_seq=state._job_seq,
            usage=state.usage,
            volumes=state.volumes,
        )
    )
    return len(header).to_bytes(_LENGTH_BYTES, "big") + header + body


def snapshot_seq(data: bytes) -> int:
    """The sequence a snapshot was taken at, reading only its header."""
    return _check(data)[0].seq


def decode_snapshot(data: bytes) -> tuple[ClusterState, int]:
    """The state a snapshot holds and the stream sequence to resume after."""
    header, body_at = _check(data)
    try:
        snap = _decoder.decode(memoryview(data)[body_at:])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SnapshotMismatch(f"damaged snapshot: {e}") from None
    jobs = {j.id: j for j in snap.jobs}
    state = ClusterState(
        settings=snap.settings,
        pools={p.name: Pool(p.name, p.order, p.scheduler) for p in snap.pools},
        nodes={n.name: Node(n.name, n.pool, n.gpus, n.order, n.cordoned) for n in snap.nodes},
        projects={p.name: Project(p.name, p.order, p.terms) for p in snap.projects},
        jobs=jobs,
        live={job_id: jobs[job_id] for job_id in snap.live},
        owners=snap.owners,
        reserved=snap.reserved,
        last_time=snap.last_time,
        events_applied=snap.events_applied,
        position=snap.position,
        held=snap.held,
        usage=snap.usage,
        volumes=snap.volumes,
    )
    state._node_seq, state._job_seq = snap.node_seq, snap.job_seq
    for job in state.live.values():
        state.share_values(job)
        state.note_ports(job)
        state.note_unpreemptible(job)
    return state, header.seq


def _check(data: bytes) -> tuple[_Header, int]:
    """The header, and where the body starts."""
    length = int.from_bytes(data[:_LENGTH_BYTES], "big")
    try:
        header = _header_decoder.decode(data[_LENGTH_BYTES : _LENGTH_BYTES + length])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SnapshotMismatch(f"not a snapshot: {e}") from None

    if header.format != FORMAT_VERSION or header.fold != FOLD_VERSION:
        raise SnapshotMismatch(
            f"snapshot format {header.format} fold {header.fold}; this code reads format "
            f"{FORMAT_VERSION} fold {FOLD_VERSION}"
        )
    return header, _LENGTH_BYTES + length
