"""The event catalogue: every fact Fairlane records, as versioned msgspec structs.

Each event has an id (also its `Nats-Msg-Id`, so republishing is harmless), a schema version,
the time it happened, the actor that caused it and the causation id of the event or command it
answers. Times are seconds: epoch seconds on a live cluster, virtual seconds in the simulator.

The schema version is always written. Events are read tolerantly (a field this code does not
know, written by a newer version, is ignored), and events of an older version are upcast before
they are decoded: both in `events/versions.py`, the one place that reads events.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from events.model import (
    ClusterSettings,
    GpuDevice,
    JobSpec,
    PreemptionFacts,
    ProjectTerms,
    Replica,
    SchedulerSettings,
    UsageFacts,
    VolumeGrant,
)

#: The catalogue's schema version. 2: `ClusterConfigured` carries its settings as one struct.
SCHEMA_VERSION: Final = 2

PreemptionReason = Literal[
    "priority", "reclaim", "pause", "cancel", "node_lost", "drain", "shutdown"
]
#: Reasons that make room for other work. Pauses, cancels, lost and drained nodes and a
#: cluster shut down (`shutdown`: its executor stopped the job's workloads as it exited, and
#: the job is queued again) are not preemptions in the user's sense and are not counted as such.
MAKES_ROOM: Final = frozenset({"priority", "reclaim"})


def _current_version() -> int:
    return SCHEMA_VERSION


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    id: str
    #: A default factory, not a default: msgspec omits fields equal to their default, and the
    #: version must always be written (a reader tells an old event by it).
    version: int = msgspec.field(default_factory=_current_version)
    time: float
    actor: str
    causation: str | None = None


# -- cluster, pools, nodes, projects ---------------------------------------------------------


class ClusterConfigured(Event, frozen=True, kw_only=True):
    """The cluster's settings, all of them (version 1 had them as fields of the event)."""

    settings: ClusterSettings = ClusterSettings()


class VolumesConfigured(Event, frozen=True, kw_only=True):
    """The host path prefixes jobs may mount, all of them after the change (an admin's
    `fairlane volumes allow` or `deny`): the last one on the log is the allowlist."""

    #: no default, so it is always written: an empty allowlist is one too
    grants: tuple[VolumeGrant, ...]


class SchedulingHeld(Event, frozen=True, kw_only=True):
    """An operator holds (or releases) scheduling: while held, no job is placed and nobody is
    preempted; stops that users asked for still happen. Used for maintenance, and to let a
    batch of submissions land before the scheduler looks at them."""

    held: bool
    reason: str = ""


class PoolConfigured(Event, frozen=True, kw_only=True):
    pool: str
    #: Replaces the cluster's settings as a whole for this pool; None follows the cluster.
    scheduler: SchedulerSettings | None = None


class NodeRegistered(Event, frozen=True, kw_only=True):
    node: str
    pool: str
    gpus: int
    gpu_uuids: tuple[str, ...] = ()
    #: Where the GPU count came from: NVML, or declared by the operator (no NVML there).
    gpu_source: Literal["nvml", "declared"] | None = None
    gpu_devices: tuple[GpuDevice, ...] = ()
    #: Where the node's replicas are reached from other nodes: a gang's rendezvous is replica
    #: 0's node's. Optional, so neither an older event nor an older reader needs an upcast:
    #: an event without it reads as None, a node on the same machine (`LOCAL_ADDRESS`).
    address: str | None = None


#: The address of a node that registered none.
LOCAL_ADDRESS: Final = "127.0.0.1"


class NodeLost(Event, frozen=True, kw_only=True):
    node: str
    reason: str = ""


class NodeCordoned(Event, frozen=True, kw_only=True):
    """An operator took the node out of service: it takes no new work. Drained (`drain`), its
    jobs are also asked to checkpoint and stop, and resume elsewhere by the usual rules."""

    node: str
    drain: bool = False
    reason: str = ""


class NodeUncordoned(Event, frozen=True, kw_only=True):
    """The node takes new work again."""

    node: str
    reason: str = ""


class ProjectConfigured(Event, frozen=True, kw_only=True):
    """The project's complete terms after the change, per pool (absent pools: no quota)."""

    project: str
    terms: dict[str, ProjectTerms]


class ProjectQuotaCrossed(Event, frozen=True, kw_only=True):
    """A project's usage in a pool went over its quota, or came back within it."""

    project: str
    pool: str
    usage: int
    quota: int
    over: bool


class LeaderElected(Event, frozen=True, kw_only=True):
    """A decision service took the lease for its kind. Its decisions expect this term to be the
    last message on `fl.leader.<kind>`, so a newer term fences the old leader out."""

    kind: str
    holder: str
    term: int


# -- jobs ------------------------------------------------------------------------------------


class JobSubmitted(Event, frozen=True, kw_only=True):
    job_id: str
    spec: JobSpec
    idempotency_key: str | None = None


class JobAdmitted(Event, frozen=True, kw_only=True):
    """Admission's resolution of the spec: what the scheduler works with from now on."""

    job_id: str
    project: str
    priority: int
    preemptible: bool
    gpus: int
    replicas: int
    min_replicas: int
    #: Pools to try, in order: only those that could ever hold the job.
    pools: tuple[str, ...]
    node: str | None = None
    preemption_delay_s: float = 0.0
    min_runtime_s: float = 0.0


class JobRejected(Event, frozen=True, kw_only=True):
    job_id: str
    reason: str
    #: why, as an `events.refusals.RefusalCode`, and the request field it is about. A plain
    #: string, not the Literal: a reader must still decode a code added after it was built.
    #: None in a rejection stored before codes were.
    code: str | None = None
    field: str | None = None


class JobNominated(Event, frozen=True, kw_only=True):
    """GPUs that victims are giving up are held for this job until they are free."""

    job_id: str
    pool: str
    replicas: tuple[Replica, ...]
    victims: tuple[str, ...]
    reason: PreemptionReason
    #: the log position (stream sequence) of the state this was decided on
    basis_seq: int = 0
    #: the version of the policy that decided it ("": not stated)
    policy_version: str = ""
    #: Rule 11: what the usage history did to the pool's fair shares (None: nothing)
    history: UsageFacts | None = None


class JobScheduled(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    pool: str
    #: The replicas this decision adds (all of them, or one more for an elastic job).
    replicas: tuple[Replica, ...]
    scale_up: bool = False
    note: str = ""
    #: the log position (stream sequence) of the state this was decided on
    basis_seq: int = 0
    #: the version of the policy that decided it ("": not stated)
    policy_version: str = ""
    #: Rule 11: what the usage history did to the pool's fair shares (None: nothing)
    history: UsageFacts | None = None


class JobStarted(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    resumed: bool = False
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None


class JobPreemptionRequested(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    reason: PreemptionReason
    #: How many replicas to stop, newest first; 0 means the whole job.
    replicas: int = 0
    for_job: str | None = None
    facts: PreemptionFacts | None = None
    #: the log position (stream sequence) of the state this was decided on
    basis_seq: int = 0
    #: the version of the policy that decided it ("": not stated)
    policy_version: str = ""


class JobPreempted(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    reason: PreemptionReason
    replicas: int = 0
    checkpointed: bool = False
    #: A replica did not exit within the grace period and was killed (SIGKILL).
    killed: bool = False
    #: Bytes of checkpoint the reporting executor stored in the cluster's checkpoint store
    #: as its replicas stopped (None: nothing stored). Optional: no upcast needed.
    stored_bytes: int | None = None
    #: The mean GPU utilization (percent) of the attempt's GPUs on the reporting node, over
    #: the samples its executor took during the attempt (None: not known, no NVML there).
    #: Optional: no upcast needed.
    gpu_utilization: float | None = None
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None
    #: It reports only the stopped replicas on `node`, each stored its checkpoint first: a
    #: stop spanning several nodes ends once every one of them reported its own (False: the
    #: whole stop at once, as reports were before). Of a stop of some replicas, `replicas`
    #: is then how many of the node's own it stopped. Optional: no upcast needed.
    own_replicas: bool = False


class JobCheckpointed(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    save_s: float = 0.0
    #: Told by the workload itself (`fairlane.workload`): the step saved and its size.
    step: int | None = None
    size_bytes: int | None = None
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None
    #: The save was over the checkpoint store's bound and not stored: `size_bytes` is the size
    #: refused, and the store still holds the save before it. Optional: no upcast needed.
    refused: bool = False


class JobProgress(Event, frozen=True, kw_only=True):
    """A workload's own report of how far it got (through its executor)."""

    job_id: str
    attempt: int
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, float] = {}
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None


class JobMessage(Event, frozen=True, kw_only=True):
    """A line a workload put on its job's timeline (through its executor)."""

    job_id: str
    attempt: int
    text: str
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None


class JobPaused(Event, frozen=True, kw_only=True):
    job_id: str


class JobResumed(Event, frozen=True, kw_only=True):
    job_id: str


class JobCompleted(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    #: The mean GPU utilization (percent) of the attempt's GPUs on the reporting node, over
    #: the samples its executor took during the attempt (None: not known, no NVML there).
    #: Optional: no upcast needed.
    gpu_utilization: float | None = None
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None


class JobFailed(Event, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    exit_code: int = 1
    reason: str = ""
    #: The mean GPU utilization (percent) of the attempt's GPUs on the reporting node, over
    #: the samples its executor took during the attempt (None: not known, no NVML there).
    #: Optional: no upcast needed.
    gpu_utilization: float | None = None
    #: The node whose executor reported it (None: written before reports named their node).
    #: Optional, so neither an older event nor an older reader needs an upcast. It is in the
    #: subject too (`subject_for`), where the server holds each executor to its own node.
    node: str | None = None


class JobCancelled(Event, frozen=True, kw_only=True):
    job_id: str


class JobPriorityChanged(Event, frozen=True, kw_only=True):
    """A user (or a simulated baseline policy) changed a job's priority."""

    job_id: str
    priority: int


# -- work relayed to one node ----------------------------------------------------------------


class Rendezvous(msgspec.Struct, frozen=True, kw_only=True):
    """Where the replicas of one attempt of a gang meet (torch.distributed's `MASTER_ADDR`
    and `MASTER_PORT`): replica 0's node's address and a port chosen by the relay from the
    log, so every replica's executor is told the same one, and the next attempt a new one."""

    attempt: int
    address: str
    port: int


class JobWork(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A job as the fold left it right after a relayed event: what its node executors act on.
    `spec` comes with the placements on the node (it is what the executor starts), not with
    every relay."""

    job_id: str
    attempt: int
    #: the fold's phase of the job (`policy.state.JobPhase`)
    phase: str
    #: every replica the job holds, on any node, in the fold's order
    held: tuple[Replica, ...] = ()
    #: replicas asked to stop (the newest ones); equal to `len(held)` for the whole job
    stop_replicas: int = 0
    #: the job's own grace period, or the cluster's when it was relayed
    grace_s: float = 30.0
    spec: JobSpec | None = None
    #: the attempt's rendezvous, relayed with its placements like the spec
    rendezvous: Rendezvous | None = None


#: The events a node's executor acts on, relayed once the fold applied them.
RelayedEvent = (
    JobScheduled
    | JobStarted
    | JobPreemptionRequested
    | JobPreempted
    | JobCheckpointed
    | JobPaused
    | JobResumed
    | JobCompleted
    | JobFailed
    | JobCancelled
    | NodeLost
)
RELAYED: Final = (
    JobScheduled,
    JobStarted,
    JobPreemptionRequested,
    JobPreempted,
    JobCheckpointed,
    JobPaused,
    JobResumed,
    JobCompleted,
    JobFailed,
    JobCancelled,
    NodeLost,
)


class WorkRelayed(Event, frozen=True, kw_only=True):
    """An event the fold applied that concerns `node`, relayed on `fl-work.<node>` (by the
    node watcher's leader, on the relay stream apart from the log), so that a node's executor
    reads only its own work. `jobs` are the jobs it concerns on that node, as the fold left
    them. The id is derived from the node and
    the source event's stream sequence, so relaying it again is a duplicate. It changes no
    cluster state: the fold ignores it."""

    node: str
    #: the stream sequence of the relayed event
    source_seq: int
    event: RelayedEvent
    jobs: tuple[JobWork, ...] = ()


class EventSetAside(Event, frozen=True, kw_only=True):
    """A service could not handle the event at `seq` (stored on `subject`) and went on without
    it, so that one bad event does not stop it for good: `reason` says why (a relay larger than
    the bus carries, text the read models refuse). It changes no cluster state: the fold
    ignores it. The id names the service, the sequence and the subject, so a service that sets
    the same event aside again (after a restart) writes a duplicate."""

    service: str
    #: the stream sequence of the event set aside
    seq: int
    #: the subject of the event set aside (the node watcher: the relay subject it could not
    #: write, `fl-work.<node>`)
    subject: str
    reason: str


def set_aside_id(service: str, seq: int, subject: str) -> str:
    return f"aside/{service}/{seq}/{subject}"


def set_aside_subject(service: str) -> str:
    """Where a service records what it set aside (`fairlane status` reads `fl.aside.>`)."""
    return f"fl.aside.{service}"


def work_subject(node: str) -> str:
    """Where a node's work is relayed (also an executor's consumer filter): outside the log's
    `fl.>`, on a stream of its own (services/runtime/relays.py). Relays of older versions
    are on `fl.work.<node>` in the log, where every reader ignores them."""
    return f"fl-work.{node}"


AnyEvent = (
    ClusterConfigured
    | SchedulingHeld
    | VolumesConfigured
    | ProjectQuotaCrossed
    | LeaderElected
    | PoolConfigured
    | NodeRegistered
    | NodeLost
    | NodeCordoned
    | NodeUncordoned
    | ProjectConfigured
    | JobSubmitted
    | JobAdmitted
    | JobRejected
    | JobNominated
    | JobScheduled
    | JobStarted
    | JobPreemptionRequested
    | JobPreempted
    | JobCheckpointed
    | JobProgress
    | JobMessage
    | JobPaused
    | JobResumed
    | JobCompleted
    | JobFailed
    | JobCancelled
    | JobPriorityChanged
    | WorkRelayed
    | EventSetAside
)

_encoder = msgspec.json.Encoder()


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


#: What an executor reports of the attempts on its node. Each names its node, in the event and
#: at the end of its subject: `fl.job.<job>.<event>.<node>`, the one subject the node's
#: executor may write it on (services/runtime/auth.py), and the fold takes it only from a node
#: the attempt has a replica on. One written before reports named their node has none, and
#: its subject stays `fl.job.<job>.<event>`.
NODE_REPORTS: Final = (
    JobStarted,
    JobPreempted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobMessage,
)
_NAMES: Final[dict[type, str]] = {}


def _name(kind: type) -> str:
    """`JobStarted` -> `job_started`, worked out once per type (replays ask per event)."""
    name = _NAMES.get(kind)
    if name is None:
        name = _NAMES[kind] = _SNAKE.sub("_", kind.__name__).lower()
    return name


def subject_for(event: Event) -> str:
    """The stream subject of an event: `fl.<aggregate>.<key>.<event>` (a node's relayed work:
    `fl-work.<node>`, in the relay stream; a node's report, `fl.job.<job>.<event>.<node>`)."""
    name = _name(type(event))
    match event:
        case (
            NodeRegistered(node=node)
            | NodeLost(node=node)
            | NodeCordoned(node=node)
            | NodeUncordoned(node=node)
        ):
            subject = f"fl.node.{node}.{name}"
        case LeaderElected(kind=kind):
            subject = f"fl.leader.{kind}"
        case ProjectConfigured(project=project) | ProjectQuotaCrossed(project=project):
            subject = f"fl.project.{project}.{name}"
        case PoolConfigured(pool=pool):
            subject = f"fl.pool.{pool}.{name}"
        case ClusterConfigured() | SchedulingHeld() | VolumesConfigured():
            subject = f"fl.cluster.{name}"
        case WorkRelayed(node=node):
            subject = work_subject(node)
        case EventSetAside(service=service):
            subject = set_aside_subject(service)
        case _:
            job_id = getattr(event, "job_id", None)
            if job_id is None:
                raise TypeError(f"no subject for event type {type(event).__name__}")
            subject = f"fl.job.{job_id}.{name}"
            if isinstance(event, NODE_REPORTS) and event.node is not None:
                subject = f"{subject}.{event.node}"
    return subject


def on_its_subject(subject: str, event: Event) -> bool:
    """Whether a node's report was stored on the subject that names its node: the server
    holds an executor to its own node's subjects, not to what the event says inside, so a
    report whose `node` is not its subject's (or that names none on a node's subject) is
    another node's word and is read as no event. Other events are not checked."""
    return not isinstance(event, NODE_REPORTS) or subject == subject_for(event)
