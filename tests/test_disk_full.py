"""A small or full disk, on a filesystem of the test's own (a tmpfs: root only).

`fairlane up` sizes JetStream to the disk or refuses it, naming what it needs, and leaves
nothing running when it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.auth import ADMIN, credentials_file, load_credentials
from services.runtime.connection import connect
from services.runtime.eventlog import STREAM
from services.runtime.servers import free_port
from tests.test_embedded import fairlane

pytestmark = pytest.mark.slow
#: skip starting PostgreSQL where nothing reads it
NO_POSTGRES = ("--postgres", "postgresql://unused")


def mounted(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`, unmounted afterwards."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root: the disk-full tests must run there")
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted(tmp_path / "tiny", "48m")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted(tmp_path / "small", "200m")


def left_running(data: Path) -> list[str]:
    """Command lines of the processes that name `data` (every program `up` starts does)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(data) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_up_refuses_a_disk_too_small_naming_what_it_needs(tiny_disk: Path) -> None:
    data = tiny_disk / "fl"
    up = fairlane("up", "--detach", "--gpus", "1", *NO_POSTGRES, data_dir=data, check=False)
    assert up.returncode == 1
    assert "not enough disk space for the event log" in up.stderr, up.stderr
    assert "MiB free, 128 MiB needed" in up.stderr and "Traceback" not in up.stderr
    assert not (data / "cluster.json").exists()
    assert left_running(data) == []


def test_up_that_fails_midway_leaves_nothing_running(tmp_path: Path) -> None:
    """nats-server cannot listen on the port it is told: `up` says so and stops it all."""
    data = tmp_path / "fl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: nobody answers there
        port = str(taken.getsockname()[1])
        up = fairlane("up", "--detach", "--gpus", "1", "--nats-port", port, *NO_POSTGRES,
                      data_dir=data, check=False)  # fmt: skip
    assert up.returncode == 1 and "Traceback" not in up.stderr, up.stderr
    assert "nats-server" in up.stderr and "everything started was stopped again" in up.stderr
    assert left_running(data) == []


def test_up_sizes_the_event_log_to_a_small_disk(small_disk: Path) -> None:
    data = small_disk / "fl"
    ports = ["--nats-port", str(free_port()), "--api-port", str(free_port())]
    fairlane("up", "--detach", "--gpus", "1", *ports, *NO_POSTGRES, data_dir=data)
    try:
        url = json.loads((data / "cluster.json").read_text())["nats_url"]

        async def max_bytes() -> int:
            creds = load_credentials(credentials_file(data, ADMIN))
            nc = await connect(url, "test", credentials=creds)
            try:
                return (await nc.jetstream().stream_info(STREAM)).config.max_bytes or 0
            finally:
                await nc.close()

        # 80% of the half of the ~200 MiB free that JetStream may take
        assert 60 << 20 < asyncio.run(max_bytes()) < 100 << 20
    finally:
        fairlane("down", data_dir=data)
    assert left_running(data) == []
