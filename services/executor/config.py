"""How one node executor is set up: its node, pool, GPUs, data folder and runtime choice."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    node: str
    pool: str
    gpus: int
    gpu_uuids: tuple[str, ...] = ()
    data_dir: Path = Path(".fairlane/executor")
    hollow: bool = False
    #: Hollow replicas exit 0 after this long (0: they run until stopped).
    hollow_runtime_s: float = 0.0
    checkpoint_poll_s: float = 1.0
    stop_workloads_on_exit: bool = False
    #: Names this run of the executor in its `NodeRegistered` id.
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def actor(self) -> str:
        return f"executor/{self.node}"
