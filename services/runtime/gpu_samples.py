"""GPU samples: what each node's GPUs are doing now, in a JetStream KV bucket, not the log.

Each node executor samples NVML at a bounded rate (services/executor/sampling.py) and puts
one value under its node's key: every GPU's utilization, memory, temperature and power, and
for each job holding GPUs there its utilization now, its average over the attempt so far and
whether it has been idle (all its GPUs at 0%) for the configured time. Samples change every
few seconds and are worthless a minute later, so they stay off the log, like heartbeats; the
bucket's TTL drops the key of a node that stopped sampling, and a reader says "unknown".
Services reach them through their host (`GpuSamples`: the bucket on a cluster, a dictionary in
one process).

A field NVML could not give (no driver, a sensor the board lacks) is None, never 0: 0% means
the GPU was seen idle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, InvalidKeyError, NotFoundError
from nats.js.kv import KeyValue

BUCKET: Final = "fairlane-gpu-samples"
#: How long a node's value counts after it was put (the bucket's TTL): several samples at
#: the slowest rate, so one late sample does not blank the node.
TTL_S: Final = 30.0
#: The sampling rate's bounds, seconds between samples (`--gpu-sample`).
MIN_EVERY_S: Final = 1.0
MAX_EVERY_S: Final = 10.0
DEFAULT_EVERY_S: Final = 5.0
#: A job whose GPUs were all at 0% this long is idle (`--idle-after`), as Run:AI's default.
DEFAULT_IDLE_AFTER_S: Final = 900.0


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU as last sampled; None where NVML could not say."""

    index: int
    uuid: str = ""
    model: str = ""
    #: percent of the last sample period in which a kernel ran (NVML's `gpu` utilization)
    utilization: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    #: the job holding it on this node (None: free)
    job_id: str | None = None


class JobGpuUsage(msgspec.Struct, frozen=True, kw_only=True):
    """A job's GPUs on one node: utilization now, on average over its attempt, and idleness."""

    job_id: str
    attempt: int
    gpus: tuple[int, ...]
    #: the mean of its GPUs' utilization in the last sample (None: unknown)
    utilization: float | None = None
    #: the mean over every sample of this attempt so far (None: none known)
    average: float | None = None
    samples: int = 0
    #: since when every one of its GPUs here has been at 0% (None: not idle now)
    zero_since: float | None = None
    #: at 0% for at least the node's `idle_after_s`
    idle: bool = False


class NodeSamples(msgspec.Struct, frozen=True, kw_only=True):
    """The value under a node's key."""

    node: str
    time: float
    #: "nvml": the numbers are NVML's; "unknown": no NVML here (every field is None)
    source: Literal["nvml", "unknown"]
    every_s: float
    idle_after_s: float
    gpus: tuple[GpuSample, ...] = ()
    jobs: tuple[JobGpuUsage, ...] = ()
    #: why NVML is not read here (its error), for the operator
    error: str = ""


def encode(samples: NodeSamples) -> bytes:
    return msgspec.json.encode(samples)


_decoder = msgspec.json.Decoder(NodeSamples)


def decode(data: bytes) -> NodeSamples:
    return _decoder.decode(data)


async def samples_bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    """The bucket, made on first use where the user may (without authentication); with it,
    `provision` made it beforehand, with a copy on every server of a cluster."""
    try:
        return await js.key_value(BUCKET)
    except (BucketNotFoundError, NotFoundError):
        pass
    try:
        config = KeyValueConfig(bucket=BUCKET, ttl=TTL_S, history=1, replicas=replicas)
        return await js.create_key_value(config)
    except BadRequestError:  # made meanwhile by someone else
        return await js.key_value(BUCKET)


async def read_all(js: JetStreamContext, nodes: Iterable[str]) -> list[NodeSamples]:
    """The latest value of each of `nodes` that has one (a key that lapsed is absent). Read
    key by key, by name: listing the bucket's keys makes a consumer each time. A value that
    does not decode (a newer writer's, say) is skipped rather than failing the reader."""
    try:
        bucket = await js.key_value(BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return []
    found: list[NodeSamples] = []
    for node in sorted(set(nodes)):
        try:
            entry = await bucket.get(node)
        except (NotFoundError, InvalidKeyError):  # no sample, or lapsed; a name no key can be
            continue
        if entry.value:
            try:
                found.append(decode(entry.value))
            except msgspec.DecodeError:
                continue
    return found


class GpuSamples(Protocol):
    """Each node's latest samples, whatever holds them."""

    async def put(self, samples: NodeSamples) -> None:
        """Make `samples` its node's latest."""
        ...

    async def read(self, nodes: Iterable[str]) -> list[NodeSamples]:
        """The latest samples of each of `nodes` that has some, by node."""
        ...


@dataclass
class KvGpuSamples:
    """The samples in the JetStream bucket (made on first use by a writer)."""

    js: JetStreamContext
    _bucket: KeyValue | None = None

    async def put(self, samples: NodeSamples) -> None:
        if self._bucket is None:
            self._bucket = await samples_bucket(self.js)
        await self._bucket.put(samples.node, encode(samples))

    async def read(self, nodes: Iterable[str]) -> list[NodeSamples]:
        return await read_all(self.js, nodes)


@dataclass
class MemoryGpuSamples:
    """Samples in one process: the latest per node, kept until replaced (nothing lapses)."""

    latest: dict[str, NodeSamples] = field(default_factory=dict)

    async def put(self, samples: NodeSamples) -> None:
        self.latest[samples.node] = samples

    async def read(self, nodes: Iterable[str]) -> list[NodeSamples]:
        return [self.latest[n] for n in sorted(set(nodes)) if n in self.latest]
