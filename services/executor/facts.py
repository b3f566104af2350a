"""What an executor knows of its node, as plain data: the planner's input besides the log's work.

The actuator keeps these up to date from what happened (a replica started or ended, a stop
sent, a checkpoint stored, a report in the log) and hands the planner a `Here` of them; no
handle, lock or task is in them, so a plan is a function of values. The mappings in a `Here`
are the actuator's own, read by the plan before anything acts on it (a copy for every plan
cost more than the plan).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from events import NodeRegistered
from events.model import Replica

AttemptKey: TypeAlias = tuple[str, int]
ReplicaKey: TypeAlias = tuple[str, int, Replica]
Closing = Literal["", "stop", "shutdown"]


@dataclass(frozen=True, slots=True)
class OverBound:
    """A checkpoint folder too large to store."""

    saves: int
    mark: float | None
    size: int
    bound: int


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    job_id: str
    attempt: int
    index: int
    replica: Replica
    launched: bool = False  # its start is over: it runs, or it could not start
    ended: bool = False
    exit_code: int | None = None
    #: What the runtime, the executor or the workload's last output line says of its end.
    detail: str = ""
    has_workload: bool = False
    stop_at: float | None = None  # when SIGTERM was sent (None: never asked to stop)
    killed: bool = False  # SIGKILL was sent
    unsaved: bool = False  # it saved a checkpoint that is not stored yet (as last looked)
    storing: bool = False
    #: After its stop: whether its folder was stored (or the store tried), and the bytes.
    stored_after_stop: bool = False
    stored_bytes: int = 0
    #: The size of the folder last put in the store from here, and whether the store refused
    #: it (over the bound: the object before it stays)
    size: int | None = None
    refused: bool = False
    over_bound: OverBound | None = None
    fetch_error: str = ""

    @property
    def key(self) -> ReplicaKey:
        return (self.job_id, self.attempt, self.replica)

    @property
    def attempt_key(self) -> AttemptKey:
        return (self.job_id, self.attempt)


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    job_id: str
    attempt: int
    announce: bool = False  # this executor reports the attempt's `JobStarted`
    scheduled_id: str | None = None
    baseline: float | None = None  # the marker's mtime before the attempt started here
    mark: float | None = None  # the marker's mtime as last looked at
    saved_by_workload: bool = False
    checkpoints: int = 0  # `JobCheckpointed` reported for it
    last_checkpoint: float = 0.0
    utilization: float | None = None  # the mean of its GPUs' samples here


@dataclass(frozen=True, slots=True)
class Here:
    node: str
    actor: str
    boot_id: str
    saves: bool = True  # replicas save into their checkpoint folders (not hollow ones)
    objects: bool = False  # checkpoints go to the cluster's store
    attempts: Mapping[AttemptKey, AttemptFacts] = field(default_factory=dict)
    replicas: Mapping[ReplicaKey, ReplicaFacts] = field(default_factory=dict)
    #: ids published, being published or given up; and those in the log (like the mappings
    #: above, the actuator's own, not copies: a plan only reads them, before anything acts on
    #: it, and these hold every report this node made)
    reported: Set[str] = frozenset()
    published: Set[str] = frozenset()
    #: attempts this node stops for a shut down (this run's, or the last run's file), and when
    shut: Mapping[AttemptKey, float] = field(default_factory=dict)
    closing: Closing = ""
    lost: bool = False  # this node was declared lost: it registers again once emptied
    registrations: int = 0  # how often it registered again
    offer: NodeRegistered | None = None  # its registration as configured
    #: the replicas' order (`replica_order`), when the caller keeps it between plans; made
    #: from `replicas` otherwise
    order: ReplicaOrder | None = field(default=None, repr=False, compare=False)
    #: each attempt's replicas here, in order (job, attempt, index): made once with the facts,
    #: since a plan looks them up for every attempt and every stop (a scan of all replicas each
    #: time made a plan quadratic in the replicas here)
    by_attempt: Mapping[AttemptKey, tuple[ReplicaFacts, ...]] = field(
        init=False, repr=False, compare=False
    )
    #: every replica here in that order
    in_order: tuple[ReplicaFacts, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        order = self.order if self.order is not None else replica_order(self.replicas)
        object.__setattr__(self, "by_attempt", order.by_attempt)
        object.__setattr__(self, "in_order", order.in_order)


@dataclass(frozen=True, slots=True)
class ReplicaOrder:
    """The replicas here in order (job, attempt, index), and each attempt's in that order."""

    by_attempt: Mapping[AttemptKey, tuple[ReplicaFacts, ...]]
    in_order: tuple[ReplicaFacts, ...]


_IN_ORDER = operator.attrgetter("job_id", "attempt", "index")
_ATTEMPT = operator.attrgetter("job_id", "attempt")


def replica_order(replicas: Mapping[ReplicaKey, ReplicaFacts]) -> ReplicaOrder:
    in_order = tuple(sorted(replicas.values(), key=_IN_ORDER))
    by_attempt = {key: tuple(group) for key, group in itertools.groupby(in_order, key=_ATTEMPT)}
    return ReplicaOrder(by_attempt, in_order)
