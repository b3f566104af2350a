"""A NATS URL no connection could use is said at once, naming what is wrong with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.runtime.connection import url_problem


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:4222",
        "127.0.0.1:4222",  # nats-py takes a server without a scheme as nats://
        "localhost",
        "tls://nats.example:4443",
        "nats://a:4222, nats://b:4222,nats://c:4222",
        "ws://[::1]:8080",
    ],
)
def test_a_url_any_nats_client_takes_passes(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("", "names no server"),
        (" , ", "names no server"),
        ("http://127.0.0.1:4222", "'http://127.0.0.1:4222' is not a NATS server's address"),
        ("nats://a:4222,bogus://b", "'bogus://b' is not a NATS server's address"),
        ("nats://h:99999", "'nats://h:99999' has no port number 0 to 65535"),
        ("nats://h:port", "'nats://h:port' has no port number"),
        ("nats://:4222", "'nats://:4222' names no host"),
    ],
)
def test_a_url_no_connection_could_use_is_named(url: str, said: str) -> None:
    problem = url_problem(url)
    assert problem is not None and problem.startswith(said)


def test_up_refuses_such_a_url_before_starting_anything(tmp_path: Path) -> None:
    """`fairlane up --nats` given the API's URL: exit 2, the flag and the value named, and
    nothing started (no cluster file)."""
    data = tmp_path / "fl"
    cmd = [sys.executable, "-m", "fairlane.cli", "up", "--nats", "http://127.0.0.1:8080"]
    done = subprocess.run(
        [*cmd, "--data-dir", str(data)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    said = "--nats http://127.0.0.1:8080: 'http://127.0.0.1:8080' is not a NATS server's address"
    assert said in " ".join(done.stderr.split())  # rich may wrap the line
    assert not (data / "cluster.json").exists()
