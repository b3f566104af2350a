"""Whose uid a workload runs as, and the folders only that uid may enter.

A workload is a tenant's code. Run as the cluster's own user it could read everything that
user reads: the credentials, the admin token, the PostgreSQL socket, other jobs' folders and,
through `/proc/<pid>/environ`, other attempts' event tokens. So an executor that runs as root
runs each job's workloads as a uid of their own, `WORKLOAD_UID_BASE + hash(job id)`, with the
same number as gid and no supplementary groups. No passwd entry is needed (`setuid` takes any
number): nothing is created on the node, and the uid is the same on every node and attempt,
so a checkpoint folder stays its job's wherever the job runs. Two jobs share a uid only on a
hash collision (one in 2**24 for a pair).

An executor that is not root cannot switch users: it refuses to start workloads (the attempt
fails and says why) unless told `--insecure-same-user` (a laptop, where the only tenant is the
one who started the cluster).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The first uid of the workloads' range: far above the ids of people and services
#: (useradd's SYS_UID_MAX and UID_MAX are 999 and 60000) and below 2**31 (some tools take
#: uids as signed).
WORKLOAD_UID_BASE: Final = 0x50000000
WORKLOAD_UID_SPAN: Final = 1 << 24
#: Folders the executor keeps workloads' folders in: others may pass through (to reach the
#: one folder that is theirs) but not list them.
PASS_THROUGH: Final = 0o711
PRIVATE: Final = 0o700

REFUSAL: Final = (
    "the executor does not run as root, so it cannot run the workload as a user of its own, "
    "and it does not run tenants' code as the cluster's user: nothing was started (start the "
    "executor as root, or with --insecure-same-user where every job is the operator's own)"
)


#: The system's own interpreters, which every user may run. The built-in workload needs only
#: the standard library, so it runs on one of these where the executor's interpreter is closed
#: to the job's user (a virtual environment under root's home, 0700, say).
SYSTEM_PYTHONS: Final = ("/usr/local/bin/python3", "/usr/bin/python3")


def unreachable(python: str) -> str:
    return (
        f"the built-in workload runs {python}, which the job's own user cannot run (a folder "
        f"on its way is closed to other users), and neither {' nor '.join(SYSTEM_PYTHONS)} "
        "is there for every user, or its code is closed to them: nothing was started "
        "(install Python where every user can run it, or name a command)"
    )


def walled_off(folder: Path) -> str:
    return (
        f"the job's own user cannot reach its folders: {folder} is closed to other users, so "
        f"nothing was started (let others pass through it: chmod o+x {folder}; or give the "
        "executor a --data-dir whose folders others may pass through)"
    )


def python_for_others(python: str) -> str | None:
    """`python` if a user with no rights of its own here may run it, else the first of the
    system's interpreters that it may (None: none)."""
    return next((p for p in (python, *SYSTEM_PYTHONS) if others_can_run(p)), None)


@dataclass(frozen=True, slots=True)
class WorkloadUser:
    uid: int
    gid: int


def job_user(job_id: str) -> WorkloadUser:
    """The uid and gid every workload of this job runs as."""
    digest = hashlib.sha256(job_id.encode()).digest()
    n = WORKLOAD_UID_BASE + int.from_bytes(digest[:8], "big") % WORKLOAD_UID_SPAN
    return WorkloadUser(n, n)


def others_can_run(path: str) -> bool:
    """Whether a user with no rights of its own here may run `path` (an interpreter under
    root's home, 0700, may not)."""
    return _others_may(Path(path), 0o001)


def others_can_read(path: Path) -> bool:
    """Whether a user with no rights of its own here may read the file at `path`."""
    return _others_may(path, 0o004)


def closed_on_the_way(path: Path) -> Path | None:
    """The first folder above `path`, from `/` down, that others may not pass through (None:
    they may pass through every one)."""
    for folder in reversed(path.resolve().parents):
        try:
            if not folder.stat().st_mode & 0o001:
                return folder
        except OSError:
            return folder
    return None


def _others_may(path: Path, others_bit: int) -> bool:
    """Every folder on the way to `path` crossable by others, and `others_bit` (run, read)
    theirs on the file itself."""
    target = path.resolve()
    try:
        crossable = all(folder.stat().st_mode & 0o001 for folder in target.parents)
        return crossable and bool(target.stat().st_mode & others_bit)
    except OSError:
        return False


def can_switch_users() -> bool:
    return os.geteuid() == 0


def own(path: Path, user: WorkloadUser, *, recursive: bool = False) -> None:
    """Give `path` (and with `recursive` everything under it) to the workload's user, 0700 for
    folders: another job's uid cannot even list it. Links are changed, not followed."""
    paths = [path]
    if recursive and path.is_dir():
        for root, dirs, files in os.walk(path):
            paths += [Path(root) / name for name in (*dirs, *files)]
    for p in paths:
        os.chown(p, user.uid, user.gid, follow_symlinks=False)
        if p.is_dir() and not p.is_symlink():
            p.chmod(PRIVATE)


def pass_through(*folders: Path) -> None:
    """Folders of the executor that workloads must cross to reach their own: 0711."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(PASS_THROUGH)
