"""Where each attempt's output is kept, on the node that ran it.

Both runtimes write a replica's stdout and stderr, as the workload wrote them, to

    <executor data dir>/runs/<job id as one path component>/<attempt>.<replica>.log

(the process runtime by handing the file to the workload; the Docker runtime by copying the
container's log stream into it). The files stay after the attempt ends, so `fairlane logs`
and the API can read any attempt later. Pure path arithmetic, standard library only, so that
a reader elsewhere can use it without the executor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

_LOG_NAME = re.compile(r"^(\d+)\.(\d+)\.log$")


def job_dir_name(job_id: str) -> str:
    """A job id as one path component (ordinary ids are unchanged)."""
    return quote(job_id, safe="-_.@+=,") if job_id not in (".", "..") else quote(job_id, safe="")


def attempt_log_path(data_dir: Path, job_id: str, attempt: int, replica: int = 0) -> Path:
    """The output of one replica of one attempt of a job."""
    return data_dir / "runs" / job_dir_name(job_id) / f"{attempt}.{replica}.log"


class AttemptLog(NamedTuple):
    attempt: int
    replica: int
    path: Path


def attempt_logs(data_dir: Path, job_id: str) -> list[AttemptLog]:
    """Every kept output of a job on this node, by attempt then replica."""
    folder = data_dir / "runs" / job_dir_name(job_id)
    found = []
    for path in folder.glob("*.log") if folder.is_dir() else ():
        match = _LOG_NAME.match(path.name)
        if match:
            found.append(AttemptLog(int(match[1]), int(match[2]), path))
    return sorted(found)
