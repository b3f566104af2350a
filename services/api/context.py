"""What every route is given: the api's settings, and its context (the read models' pool, the
host, the live streams' places), a dependency made once at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg
from litestar.datastructures import State
from litestar.di import NamedDependency

from services.api.streams import StreamPlaces
from services.runtime.host import Host

NodeRuntime = Literal["process", "docker"]


@dataclass(frozen=True)
class Settings:
    nats_url: str
    postgres_dsn: str
    admin_token_file: Path | None = None
    #: Live streams served at once (each holds a consumer on the log).
    max_streams: int = 64
    #: How every node's executor runs workloads, where the deployment knows it (the embedded
    #: cluster does): "process" refuses a job that names an image, which it would ignore.
    node_runtime: NodeRuntime | None = None


@dataclass
class Context:
    db: asyncpg.Pool
    #: the log, commands and what else the api reaches on the bus
    host: Host
    streams: StreamPlaces
    #: one audit at a time: each folds the whole log in a worker thread
    audits: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(1))
    node_runtime: NodeRuntime | None = None


Ctx = NamedDependency[Context]


def get_context(state: State) -> Context:
    context: Context = state.ctx
    return context
