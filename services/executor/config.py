"""How one node executor is set up: its node, pool, GPUs, data folder and runtime choice."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from events.catalogue import LOCAL_ADDRESS
from events.model import GpuDevice
from services.executor.storage import CheckpointStorage
from services.runtime.gpu_samples import DEFAULT_EVERY_S, DEFAULT_IDLE_AFTER_S


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    node: str
    pool: str
    gpus: int
    gpu_uuids: tuple[str, ...] = ()
    #: NVML's description of the GPUs, and whether the count came from NVML or was declared.
    gpu_devices: tuple[GpuDevice, ...] = ()
    gpu_source: Literal["nvml", "declared"] = "declared"
    data_dir: Path = Path(".fairlane/executor")
    #: Where other nodes reach this node's replicas (a gang's `MASTER_ADDR` when replica 0
    #: runs here); registered with the node.
    address: str = LOCAL_ADDRESS
    hollow: bool = False
    #: How replicas run: local processes, or Docker containers (the job's image).
    runtime: Literal["process", "docker"] = "process"
    #: The Docker engine's address (None: aiodocker's default, DOCKER_HOST or the socket).
    docker_host: str | None = None
    #: The containers' network mode (`host`: training jobs talk to each other over the
    #: node's network, as NCCL expects).
    docker_network: str = "host"
    #: Hollow replicas exit 0 after this long (0: they run until stopped).
    hollow_runtime_s: float = 0.0
    checkpoint_poll_s: float = 1.0
    #: Where the jobs' checkpoints are kept: the cluster's object store (the default) or a
    #: folder shared by every node (see `storage`).
    checkpoint_storage: CheckpointStorage = field(default_factory=CheckpointStorage)
    #: How often the node's heartbeat is put in the heartbeat bucket (None: never; hollow
    #: nodes, for benchmarks that run no node watcher, never do either).
    heartbeat_s: float | None = 2.0
    stop_workloads_on_exit: bool = False
    #: Seconds between two samples of the GPUs (None: never sampled; hollow nodes never are).
    gpu_sample_s: float | None = DEFAULT_EVERY_S
    #: A job whose GPUs here were all at 0% this long is flagged idle.
    idle_after_s: float = DEFAULT_IDLE_AFTER_S
    #: On exit, stop the workloads as a preemption does and report them stopped for a shut
    #: down (`JobPreempted(reason="shutdown")`), so the jobs are queued again (see `shutdown`).
    shutdown_on_exit: bool = False
    #: Run workloads as the executor's own user (`--insecure-same-user`): every job may then
    #: read what the executor reads. False: each job's workloads run as a uid of their own,
    #: which needs root; an executor that is not root refuses to start them
    #: (`services.executor.identity`). True here for executors built in-process (tests and
    #: benchmarks run their own code); `python -m services.executor` defaults to False.
    same_user: bool = True
    #: Names this run of the executor in its `NodeRegistered` id.
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def actor(self) -> str:
        return f"executor/{self.node}"
