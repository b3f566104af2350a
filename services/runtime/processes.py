"""Whether a process exists, by its id: for the embedded cluster's bookkeeping and the
executor's workloads alike."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts, a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
