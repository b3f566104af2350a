"""Value types carried inside events: small, frozen, versioned with the events that hold them.

Like the events, they are read tolerantly: a field this code does not know (written by a newer
version) is ignored, never an error.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SchedulerType = Literal["fair_share", "priority", "round_robin"]
Fitting = Literal["best", "worst"]
VictimOrder = Literal["newest", "cost"]


class SchedulerSettings(msgspec.Struct, frozen=True):
    """How one pool (or the whole cluster, by default) is scheduled."""

    type: SchedulerType = "fair_share"
    fitting: Fitting = "best"
    victim_order: VictimOrder = "newest"
    #: Rule 11: the half-life of the usage history the fair share weighs (None: off).
    usage_half_life_s: float | None = None
    #: Rule 11: how strongly the history moves the shares (0: as if it were off).
    usage_k: float = 1.0


class PriorityClass(msgspec.Struct, frozen=True):
    name: str
    priority: int
    preemptible: bool


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("train", 50, True),
    PriorityClass("interactive", 75, True),
    PriorityClass("build", 100, False),
    PriorityClass("inference", 125, False),
)


class ClusterSettings(msgspec.Struct, frozen=True):
    """Cluster-wide settings, as a whole: `ClusterConfigured` replaces them all at once."""

    scheduler: SchedulerSettings = SchedulerSettings()
    preemption_grace_s: float = 30.0
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    default_compute_pool: str | None = None
    default_aux_pool: str | None = None


class ProjectTerms(msgspec.Struct, frozen=True):
    """A project's terms in one pool."""

    quota: int = 0
    over_quota_weight: int = 1
    limit: int | None = None
    priority: int = 100


class CheckpointModel(msgspec.Struct, frozen=True):
    """Simulated checkpointing (scenario core engine and simulator only)."""

    every_s: float
    save_s: float = 0.0
    restore_s: float = 0.0


class PortMapping(msgspec.Struct, frozen=True, array_like=True):
    """A port a replica publishes on its node (`--port HOST:CONTAINER`): the node's `host` port
    reaches the workload's `container` port. A node publishes a host port once, so the policy
    never places two replicas that publish the same host port on one node."""

    host: int
    container: int


class VolumeMount(msgspec.Struct, frozen=True, array_like=True):
    """A folder of the node a replica's container sees (`--volume HOST:CONTAINER[:ro|rw]`):
    the node's `host` path at the container's `container` path, read-only unless
    `read_only` is false. Admission takes it only under a prefix the cluster allows
    (`VolumeGrant`), and only the Docker runtime mounts it."""

    host: str
    container: str
    read_only: bool = True

    def text(self) -> str:
        """As `--volume` takes it: `HOST:CONTAINER:ro` or `:rw`."""
        return f"{self.host}:{self.container}:{'ro' if self.read_only else 'rw'}"


class VolumeGrant(msgspec.Struct, frozen=True):
    """A host path prefix an admin lets jobs mount (`fairlane volumes allow`): the folder and
    everything under it, read-only unless `read_write`."""

    prefix: str
    read_write: bool = False


class JobSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a user asked for. Admission resolves defaults into JobAdmitted."""

    project: str
    priority_class: str | None = None
    priority: int | None = None
    preemptible: bool | None = None
    gpus: int = 1
    replicas: int = 1
    min_replicas: int | None = None
    pools: tuple[str, ...] = ()
    node: str | None = None
    preemption_delay_s: float = 0.0
    min_runtime_s: float = 0.0
    command: tuple[str, ...] = ()
    image: str | None = None
    #: The workload's own environment, as KEY=VALUE (Fairlane's own FAIRLANE_* and GPU
    #: variables are set after these and win).
    env: tuple[str, ...] = ()
    #: Seconds between SIGTERM and SIGKILL when it is stopped (default: the cluster's
    #: preemption grace).
    grace_s: float | None = None
    duration_s: float | None = None
    checkpoint: CheckpointModel | None = None
    #: The folder the workload runs in, an absolute path on the node (None: for the process
    #: runtime, the job's folder of run files on the node; for Docker, the image's own).
    #: Optional, so an older event reads as None and no upcast is needed.
    working_dir: str | None = None
    #: Ports each replica publishes on its node (an interactive job's notebook, say).
    #: Optional, so an older event reads as none and no upcast is needed.
    ports: tuple[PortMapping, ...] = ()
    #: Folders of the node mounted into each replica's container (Docker runtime only).
    #: Optional, so an older event reads as none and no upcast is needed.
    volumes: tuple[VolumeMount, ...] = ()

    def host_ports(self) -> tuple[int, ...]:
        """The node ports each replica takes (what placing must find free on a node)."""
        return tuple(p.host for p in self.ports) if self.ports else ()


class Replica(msgspec.Struct, frozen=True, array_like=True):
    """One replica's place: a node and the indexes of the GPUs it holds there."""

    node: str
    gpus: tuple[int, ...]


class GpuDevice(msgspec.Struct, frozen=True, omit_defaults=True):
    """One GPU of a node as NVML describes it."""

    index: int
    uuid: str
    model: str = ""
    memory_mb: int = 0


class PreemptionFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the policy looked at when it chose a victim, so a person can read why."""

    pool: str
    fair_share: dict[str, int] = {}
    usage: dict[str, int] = {}
    quota: dict[str, int] = {}
    victim_gpus: int = 0
    cost_gpu_s: float | None = None
    note: str = ""
    #: Rule 11: what the usage history did to the pool's fair shares (None: nothing)
    history: UsageFacts | None = None


class UsageFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    """Rule 11: the usage history a decision's fair shares weighed, per project of the pool
    with a share or demand: its decayed usage U (a part of the pool's decayed GPU-seconds),
    the part P of each round's GPUs above quota it was given, its fair share, and the fair
    share the weights alone would give it."""

    half_life_s: float
    k: float
    decayed_usage: dict[str, float] = {}
    share_weight: dict[str, float] = {}
    fair_share: dict[str, int] = {}
    without_history: dict[str, int] = {}
