"""A nats-server started here runs with Go's scheduler held to half the cores (it shares the
machine with every service), unless the environment says how many threads it takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.servers import NatsServer, go_threads

pytestmark = pytest.mark.nats


def test_half_the_cores_at_least_one_unless_the_environment_says() -> None:
    assert go_threads({}, 16) == {"GOMAXPROCS": "8"}
    assert go_threads({}, 2) == {"GOMAXPROCS": "1"}
    assert go_threads({}, 1) == {"GOMAXPROCS": "1"}
    assert go_threads({}, None) == {"GOMAXPROCS": "1"}
    assert go_threads({"GOMAXPROCS": "3"}, 16) == {}  # an operator's own setting stands


async def test_the_server_process_runs_with_it(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    try:
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        want = os.environ.get("GOMAXPROCS") or str(max(1, (os.cpu_count() or 2) // 2))
        assert f"GOMAXPROCS={want}".encode() in environ
    finally:
        await server.stop()
