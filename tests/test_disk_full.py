"""A small or full disk, on a filesystem of the test's own (a tmpfs: root only).

`fairlane up` sizes JetStream to the disk or refuses it, naming what it needs, and leaves
nothing running when it fails. When the disk under JetStream fills, submissions are answered
"unavailable" (503), and none answered "nothing was written" is carried out later (the others
say they may still take effect, and are resolved by sending them again with their idempotency
key, each carried out once); once space returns, nats-server
is restarted by the supervisor (it refuses writes to a stream that failed one until then),
and the services and the executor carry on by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from events import JobCompleted, JobSubmitted
from services.runtime.auth import ADMIN, credentials_file, load_credentials
from services.runtime.connection import connect
from services.runtime.eventlog import STREAM, JetStreamLog
from services.runtime.relays import RELAY_STREAM
from tests.test_embedded import fairlane, port_flags

pytestmark = pytest.mark.slow
#: skip starting PostgreSQL where nothing reads it
NO_POSTGRES = ("--postgres", "postgresql://unused")


@contextlib.contextmanager
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
    with mounted(tmp_path / "tiny", "48m") as path:
        yield path


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


async def check_sized(data: Path, url: str) -> None:
    """The log and the relay stream sized to a store's disk of ~160 MiB: of the half that
    JetStream takes, 50% for the log and 30% for the relay stream."""
    creds = load_credentials(credentials_file(data, ADMIN))
    nc = await connect(url, "test", credentials=creds)
    try:
        js = nc.jetstream()
        infos = [await js.stream_info(stream) for stream in (STREAM, RELAY_STREAM)]
        events, relays = (info.config.max_bytes or 0 for info in infos)
        assert 30 << 20 < events < 50 << 20 and 16 << 20 < relays < 30 << 20, (events, relays)
    finally:
        await nc.close()


async def events(data: Path, url: str) -> list[object]:
    creds = load_credentials(credentials_file(data, ADMIN))
    log = JetStreamLog(await connect(url, "test", credentials=creds))
    try:
        return [s.event async for s in log.read(1)]
    finally:
        await log.nc.close()


def test_a_full_disk_is_ridden_out_and_nothing_answered_503_is_created(tmp_path: Path) -> None:
    data = tmp_path / "fl"
    ports = port_flags()
    with mounted(data / "nats", "160m") as store:  # JetStream's store only: a disk of its own
        try:  # (a failed `up` leaves the cluster to `down` too)
            fairlane("up", "--detach", "--gpus", "2", *ports, data_dir=data)  # the API: PostgreSQL
            info = json.loads((data / "cluster.json").read_text())
            asyncio.run(check_sized(data, info["nats_url"]))  # to the store's disk
            token = (data / "admin-token").read_text().strip()
            api = httpx.Client(
                base_url=info["api_url"], headers={"Authorization": f"Bearer {token}"}, timeout=90
            )
            deadline = time.monotonic() + 30
            while (made := fairlane("project", "set", "t", data_dir=data, check=False)).returncode:
                assert time.monotonic() < deadline, made.stderr  # the API is slow to listen
                time.sleep(0.5)

            def submit(job: str, *command: str) -> httpx.Response:
                body = {"job_id": job, "project": "t", "gpus": 1, "idempotency_key": job}
                return api.post("/v1/jobs", json={**body, "command": list(command or ["true"])})

            assert submit("before", "sleep", "3").status_code == 201
            filler = store / "filler"
            fill = ["dd", "if=/dev/zero", f"of={filler}", "bs=1M"]
            subprocess.run(fill, capture_output=True, check=False)  # until the disk is full
            # at once: admission carries them out one at a time, the later ones wait in line
            with ThreadPoolExecutor(5) as pool:  # (the first may fit in what was allocated)
                full = dict(enumerate(pool.map(submit, [f"full{i}" for i in range(5)])))
            codes = [r.status_code for r in full.values()]
            assert codes.count(503) >= 3 and set(codes) <= {201, 503}, [
                r.text for r in full.values()
            ]
            filler.unlink()  # space returns: nobody restarts anything by hand
            deadline = time.monotonic() + 60
            while (after := submit("after")).status_code != 201:
                assert time.monotonic() < deadline, after.text
                time.sleep(1)
            while True:  # nothing stuck: the job running through it and the one after end
                stored = asyncio.run(events(data, info["nats_url"]))
                done = {e.job_id for e in stored if isinstance(e, JobCompleted)}
                if {"before", "after"} <= done:
                    break
                assert time.monotonic() < deadline, done
                time.sleep(1)
            created = [e.job_id for e in stored if isinstance(e, JobSubmitted)]
            for i, answer in full.items():
                if answer.status_code == 201:
                    continue
                if "may still take effect" not in answer.text:  # it said nothing was written
                    assert f"full{i}" not in created, answer.text
                    continue
                assert f"idempotency key 'full{i}'" in answer.text, answer.text
                again = submit(f"full{i}")  # how to learn its outcome, as the answer says
                assert again.status_code == 201, again.text
            stored = asyncio.run(events(data, info["nats_url"]))
            created = [e.job_id for e in stored if isinstance(e, JobSubmitted)]
            assert len(created) == len(set(created)), created  # none carried out twice
        finally:
            fairlane("down", data_dir=data)
