"""Programs started to outlive the command that starts them (`fairlane up --detach`, `fairlane
node add`), and stopped by their pid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.runtime.processes import pid_exists


async def spawn_detached(name: str, args: list[str], data_dir: Path) -> int:
    """Start `python ARGS` in a session of its own, its output appended to
    DATA_DIR/logs/NAME.log, and return its pid: it outlives the command that started it."""
    # subprocess, not asyncio's: from Python 3.12 on, asyncio kills the children it still
    # tracks when the interpreter exits, and `up --detach` exits leaving them running
    with (data_dir / "logs" / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(  # noqa: ASYNC220  (returns once the child is exec'd)
            [sys.executable, *args],
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return process.pid


async def stop_pid(pid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL if it has not ended within `grace_s`; False if it was not
    running."""
    if not pid_exists(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_exists(pid) or reaped(pid):
            return True
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def reaped(pid: int) -> bool:
    """Reap our own child if it exited (a zombie still answers kill(pid, 0))."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid
