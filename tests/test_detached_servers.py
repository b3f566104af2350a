"""Servers started by a command that then exits keep running (`fairlane up --detach`).

From Python 3.12 on, asyncio kills the child processes it still tracks when the interpreter
exits; a server started through asyncio's subprocess API died a moment after `up --detach`
returned (seen on a GPU machine with Python 3.12). This runs the start in an interpreter of
its own, as `up` does, and checks the server outlives it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.nats

START_AND_EXIT = """
import asyncio, sys
from pathlib import Path
from cluster.servers import NatsServer

async def main() -> None:
    server = NatsServer(Path(sys.argv[1]))
    await server.start()
    print(server.process.pid, server.port, flush=True)

asyncio.run(main())
"""


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_server_outlives_the_interpreter_that_started_it(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    started = subprocess.run(
        [sys.executable, "-c", START_AND_EXIT, str(tmp_path / "nats")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    pid, port = (int(word) for word in started.stdout.split())
    try:
        time.sleep(1.0)  # the kill, where there is one, comes as the interpreter winds down
        assert listens(port), f"nats-server (pid {pid}) died with the interpreter that started it"
    finally:
        os.kill(pid, signal.SIGTERM)
