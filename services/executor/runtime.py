"""Runtimes: how the executor starts, watches and stops one replica of an attempt.

`Runtime` is the seam: the process runtime here, the hollow one for benchmarks, and later a
Docker runtime (aiodocker) with the same three operations: `start` a replica, `adopt` one that
an earlier executor process recorded, and the `Workload` handle's `wait` / `signal`.

The process runtime starts every replica through `services.executor.shim` in a session of its
own (`setsid`), so:
- the executor dying (even `kill -9`) leaves the workload running, to be adopted later;
- SIGTERM and SIGKILL go to the whole process group (`killpg`), children of the workload too;
- the shim writes the workload's exit status to a file, which is how a restarted executor
  learns how a workload it did not start ended (it cannot `waitpid` a process that is not its
  child).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import msgspec
import structlog

from events.model import PortMapping, VolumeMount
from services.executor.identity import (
    REFUSAL,
    WorkloadUser,
    can_switch_users,
    closed_on_the_way,
    job_user,
    others_can_read,
    own,
    pass_through,
    python_for_others,
    unreachable,
    walled_off,
)
from services.executor.logs import job_dir_name
from services.executor.shim import exit_code_of
from services.runtime.processes import pid_exists

log = structlog.get_logger("fairlane.executor.runtime")

POLL_S: Final = 0.2  # liveness polling where pidfd is not available
SIGTERM_EXIT: Final = 128 + signal.SIGTERM
SIGKILL_EXIT: Final = 128 + signal.SIGKILL
#: The workload events endpoint's token in a replica's environment (see `endpoint`).
TOKEN_ENV: Final = "FAIRLANE_EVENTS_TOKEN"


def safe_name(name: str) -> str:
    """A job id as one path component (ordinary ids are unchanged)."""
    return job_dir_name(name)


def job_checkpoints(root: Path, job_id: str) -> Path:
    """The folder of a job's checkpoints under `root` (the node's, or the shared one)."""
    return root / safe_name(job_id)


def checkpoint_dir(root: Path, job_id: str, replica: int) -> Path:
    """`FAIRLANE_CHECKPOINT_DIR` of one replica of a job: the same for every attempt, and each
    replica its own, so the replicas of a gang never write over each other's files."""
    return job_checkpoints(root, job_id) / f"replica-{replica}"


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one replica."""

    job_id: str
    attempt: int
    replica: int  # index in the job's held replicas (FAIRLANE_REPLICA)
    gpus: tuple[int, ...]
    command: tuple[str, ...]  # empty: the built-in workload
    image: str | None
    env: dict[str, str]
    checkpoint_dir: Path
    run_dir: Path  # exit-status files and logs of this job's attempts
    #: Where the workload runs (the job's `working_dir`); None: the process runtime runs it
    #: in `run_dir`, Docker in the image's own working directory. Never the checkpoint
    #: folder: that one is only named in the environment.
    working_dir: Path | None = None
    #: Ports the replica publishes on its node (the policy placed it where they are free).
    ports: tuple[PortMapping, ...] = ()
    #: Folders of the node the replica's container mounts (only the Docker runtime can).
    volumes: tuple[VolumeMount, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.attempt}.{self.replica}"

    @property
    def log_file(self) -> Path:
        """Where the replica's output is kept (see `services.executor.logs`)."""
        return self.run_dir / f"{self.name}.log"


class ProcessRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One started replica as written to `processes.json`, enough to find it again after the
    executor restarts. Unknown fields are allowed, so a newer executor's file still reads."""

    job_id: str
    attempt: int
    replica: int
    node: str
    gpus: tuple[int, ...]
    started_at: float
    checkpoint_mtime: float | None  # the checkpoint marker's mtime when the attempt started
    runtime: str = "process"
    pid: int = 0
    start_ticks: int | None = None  # /proc/<pid>/stat starttime, against pid reuse
    exit_file: str = ""
    container: str = ""  # the Docker runtime's container id
    log_file: str = ""
    #: The attempt's token for the workload events endpoint (see `endpoint`).
    token: str = ""


class Workload(Protocol):
    """A running (or ended) replica."""

    @property
    def record(self) -> ProcessRecord | None:
        """What to persist for adoption; None for runtimes with nothing to find again."""

    @property
    def failure(self) -> str | None:
        """Why it could not start, where the runtime knows (for `JobFailed`'s reason)."""

    def alive(self) -> bool: ...

    async def wait(self) -> int | None:
        """The exit code once it ended (128 + N for signal N); None if it ended unobserved and
        left no status (for example the machine rebooted)."""

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole workload; a no-op once it ended."""

    def discard(self) -> None:
        """The executor is done with it (its end is reported): what the runtime kept to tell
        how it ended (a stopped container) may go."""


class Runtime(Protocol):
    name: str
    #: Whether the runtime starts real work (processes, containers): their output is shipped,
    #: their records kept, the workloads' endpoint served, a gang's port checked.
    real: bool
    #: Whether its replicas save checkpoints into their folders (the `.checkpoint` marker and
    #: the folder): markers are polled, folders stored and fetched only then.
    saves: bool

    async def start(self, launch: Launch, node: str, checkpoint_mtime: float | None) -> Workload:
        """Start one replica. Failing to start is not an exception: the workload ends at once
        with an exit code (127 for a command that is not there)."""

    async def found(self, records_path: Path, node: str) -> list[ProcessRecord]:
        """What an earlier executor process on `node` started (alive or not): the process
        runtime reads its record file, the Docker runtime asks for containers by label."""

    def adopt(self, record: ProcessRecord) -> Workload:
        """The handle of a replica an earlier executor process started (alive or not)."""

    def adopt_unrecorded(self, launch: Launch) -> Workload | None:
        """A replica the log says runs here but nothing was recorded for: None means it is
        lost (the process runtime); the hollow runtime pretends it runs."""

    async def close(self) -> None:
        """Let go of connections (workloads keep running)."""


# -- processes ---------------------------------------------------------------------------------


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if there is no such live
    process (gone, or a zombie). Together with the pid it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def read_exit_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


async def wait_for_pid(pid: int, start_ticks: int | None = None) -> None:
    """Return once process `pid` has exited (a zombie counts), child or not. With
    `start_ticks`, a process with that pid but another start time is not the one meant."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (OSError, AttributeError):  # no pidfd here: poll
        while _exists(pid) and (start_ticks is None or proc_start_ticks(pid) == start_ticks):  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
        return
    if start_ticks is not None and proc_start_ticks(pid) != start_ticks:
        os.close(fd)  # the pid was reused before the pidfd was opened: ours is gone
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _exists(pid: int) -> bool:
    """Exists and is not a zombie (where /proc tells)."""
    if not pid_exists(pid):
        return False
    return proc_start_ticks(pid) is not None or not Path("/proc").is_dir()


@dataclass(eq=False)
class ProcessWorkload:
    """A replica running as a process group led by the shim."""

    _record: ProcessRecord
    child: bool  # started by this executor process (so it can be reaped with waitpid)
    _code: int | None = None
    _ended: bool = False
    _wait: asyncio.Task[int | None] | None = field(default=None, repr=False)
    _failure: str | None = None

    @property
    def record(self) -> ProcessRecord:
        return self._record

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def pid(self) -> int:
        return self._record.pid

    def alive(self) -> bool:
        if self._ended:
            return False
        if self.child:
            return True  # cleared by wait() when it is reaped
        ticks = proc_start_ticks(self.pid)
        return ticks is not None and ticks == self._record.start_ticks

    async def wait(self) -> int | None:
        if self._wait is None:
            self._wait = asyncio.ensure_future(self._wait_once())
        return await asyncio.shield(self._wait)

    async def _wait_once(self) -> int | None:
        if self.alive():
            await wait_for_pid(self.pid, None if self.child else self._record.start_ticks)
        status: int | None = None
        if self.child:
            # Anything the workload left behind in its group goes with it (the group still
            # exists while the shim is an unreaped zombie, so its id cannot have been reused).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                # It has exited (the pidfd said so): reaping does not block.
                pid, raw = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222
                if pid:
                    status = exit_code_of(os.waitstatus_to_exitcode(raw))
        self._ended = True
        recorded = read_exit_file(Path(self._record.exit_file))
        self._code = recorded if recorded is not None else status
        return self._code

    def discard(self) -> None:
        Path(self._record.exit_file).unlink(missing_ok=True)

    def signal(self, sig: int) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            log.error("cannot signal workload", pid=self.pid, error=str(e))


def workload_env(own: dict[str, str]) -> dict[str, str]:
    """The executor's environment without its own FAIRLANE_* variables, plus the replica's."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    return {**inherited, **own}


def home_dir(launch: Launch) -> Path:
    """A workload's own folder (its HOME, and where it runs without a working directory) when
    it runs as a user of its own: the run folder beside it holds the executor's files."""
    return launch.run_dir / "home"


#: The folder holding the `services` package, and the files the built-in workload's user must
#: read to run it (`python -m services.executor.workload`)
CODE_ROOT: Final = Path(__file__).resolve().parents[2]
BUILTIN_FILES: Final = tuple(
    CODE_ROOT / name
    for name in ("services/__init__.py", "services/executor/__init__.py",
                 "services/executor/workload.py")
)  # fmt: skip


class ProcessRuntime:
    """Replicas as local processes: as a user of their own per job where the executor runs as
    root (`identity`), as the executor's own user only where `same_user` says so."""

    name = "process"
    real = True
    saves = True

    def __init__(self, python: str = sys.executable, same_user: bool = True) -> None:
        self.python = python
        self.same_user = same_user

    def user(self, launch: Launch) -> WorkloadUser | None:
        """Whose uid the replica runs as (None: the executor's own)."""
        return None if self.same_user else job_user(launch.job_id)

    def argv(self, launch: Launch, builtin: str | None = None) -> list[str]:
        """The shim's command line; `builtin`: the interpreter of the built-in workload (by
        default the executor's own)."""
        workload = [builtin or self.python, "-m", "services.executor.workload"]
        command = list(launch.command) or workload
        user = self.user(launch)
        default_cwd = launch.run_dir if user is None else home_dir(launch)
        switch = [] if user is None else ["--uid", str(user.uid), "--gid", str(user.gid)]
        return [
            self.python,
            "-m",
            "services.executor.shim",
            "--exit-file",
            str(self.exit_file(launch)),
            "--cwd",
            str(launch.working_dir or default_cwd),
            *switch,
            "--",
            *command,
        ]

    def prepare(self, launch: Launch, user: WorkloadUser) -> dict[str, str]:
        """The folders of a replica that runs as `user`: its home and checkpoint folder its
        own (0700), every folder of the executor on the way there 0711 (crossed, not listed);
        its environment with HOME in its own folder."""
        checkpoints_root = launch.checkpoint_dir.parent.parent
        pass_through(launch.run_dir.parent.parent, launch.run_dir.parent, launch.run_dir)
        pass_through(checkpoints_root)
        home = home_dir(launch)
        home.mkdir(exist_ok=True)
        own(home, user)
        own(launch.checkpoint_dir.parent, user)  # the job's: the replicas' folders and `.exit`
        own(launch.checkpoint_dir, user, recursive=True)  # a fetched checkpoint is root's until now
        # no passwd entry names the uid: say a name, for programs that ask (getpass)
        name = f"fairlane-{user.uid}"
        return {**launch.env, "HOME": str(home), "USER": name, "LOGNAME": name}

    @staticmethod
    def exit_file(launch: Launch) -> Path:
        return launch.run_dir / f"{launch.name}.exit"

    async def start(self, launch: Launch, node: str, checkpoint_mtime: float | None) -> Workload:
        if launch.image:
            log.warning("the process runtime ignores the image", job=launch.job_id)
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        exit_file = self.exit_file(launch)
        exit_file.unlink(missing_ok=True)
        if launch.volumes:  # a process would run without the folders it expects: refused
            asked = ", ".join(v.text() for v in launch.volumes)
            why = f"the process runtime mounts no volumes (the job asks for {asked})"
            return self._refused(launch, node, checkpoint_mtime, exit_file, why)
        user = self.user(launch)
        env, builtin = launch.env, None
        if user is not None:
            if not can_switch_users():
                return self._refused(launch, node, checkpoint_mtime, exit_file, REFUSAL)
            if not launch.command:
                builtin = python_for_others(self.python)
                if builtin is None or not all(map(others_can_read, BUILTIN_FILES)):
                    why = unreachable(self.python)
                    return self._refused(launch, node, checkpoint_mtime, exit_file, why)
            env = self.prepare(launch, user)
            closed = closed_on_the_way(launch.checkpoint_dir.parent) or closed_on_the_way(
                home_dir(launch)
            )
            if closed is not None:
                why = walled_off(closed)
                return self._refused(launch, node, checkpoint_mtime, exit_file, why)
            if builtin is not None and builtin != self.python:
                # the system's interpreter knows nothing of the executor's environment: it
                # finds the workload's package where the executor's does
                env = {**env, "PYTHONPATH": str(CODE_ROOT)}
        # 0600: the workload writes through the descriptor; no other job's user may read it
        output = os.open(launch.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # posix_spawn, not asyncio's subprocesses: those are killed when their transport
            # is closed (at the executor's exit), and these must outlive the executor.
            pid = os.posix_spawn(  # noqa: ASYNC221  (returns once the shim is exec'd)
                self.python,
                self.argv(launch, builtin),
                workload_env(env),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, output, 1),
                    (os.POSIX_SPAWN_DUP2, output, 2),
                ],
                setsid=True,
            )
        except OSError as e:
            # The shim itself could not start (no python?): record an ended workload.
            log.error("could not start the shim", job=launch.job_id, error=str(e))
            exit_file.write_text("127\n")
            pid = 0
        finally:
            os.close(output)
        record = ProcessRecord(
            job_id=launch.job_id,
            attempt=launch.attempt,
            replica=launch.replica,
            node=node,
            gpus=launch.gpus,
            started_at=time.time(),
            checkpoint_mtime=checkpoint_mtime,
            pid=pid,
            start_ticks=proc_start_ticks(pid) if pid else None,
            exit_file=str(exit_file),
            token=launch.env.get(TOKEN_ENV, ""),
        )
        workload = ProcessWorkload(record, child=pid != 0)
        if pid == 0:
            workload._ended, workload._code = True, 127
        return workload

    @staticmethod
    def _refused(
        launch: Launch, node: str, checkpoint_mtime: float | None, exit_file: Path, why: str
    ) -> Workload:
        """Not started, for the reason `why` (it cannot run as a user of its own, or it needs
        volumes)."""
        log.error("workload not started", job=launch.job_id, reason=why)
        exit_file.write_text("126\n")
        record = ProcessRecord(
            job_id=launch.job_id,
            attempt=launch.attempt,
            replica=launch.replica,
            node=node,
            gpus=launch.gpus,
            started_at=time.time(),
            checkpoint_mtime=checkpoint_mtime,
            exit_file=str(exit_file),
        )
        return ProcessWorkload(record, child=False, _code=126, _ended=True, _failure=why)

    async def found(self, records_path: Path, node: str) -> list[ProcessRecord]:
        return [r for r in load_records(records_path) if r.node == node]

    def adopt(self, record: ProcessRecord) -> Workload:
        return ProcessWorkload(record, child=False)

    def adopt_unrecorded(self, launch: Launch) -> Workload | None:
        return None

    async def close(self) -> None:
        pass


# -- hollow ------------------------------------------------------------------------------------


class HollowWorkload:
    """A replica that only exists in the executor's memory (kubemark's hollow node)."""

    def __init__(self, runtime_s: float) -> None:
        self._ended = asyncio.Event()
        self._code: int | None = None
        self._runtime_s = runtime_s

    @property
    def record(self) -> ProcessRecord | None:
        return None

    @property
    def failure(self) -> str | None:
        return None

    def alive(self) -> bool:
        return not self._ended.is_set()

    async def wait(self) -> int | None:
        if self._runtime_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._runtime_s):  # wait_for may swallow a cancel
                    await self._ended.wait()
            if not self._ended.is_set():
                self._end(0)
        else:
            await self._ended.wait()
        return self._code

    def _end(self, code: int) -> None:
        if not self._ended.is_set():
            self._code = code
            self._ended.set()

    def signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            self._end(128 + sig)

    def discard(self) -> None:
        pass


class HollowRuntime:
    """Starts nothing: a scheduled replica runs at once until it is stopped, or for
    `runtime_s` seconds and then exits 0 (0: until stopped)."""

    name = "hollow"
    real = False
    saves = False

    def __init__(self, runtime_s: float = 0.0) -> None:
        self.runtime_s = runtime_s

    async def start(self, launch: Launch, node: str, checkpoint_mtime: float | None) -> Workload:
        return HollowWorkload(self.runtime_s)

    async def found(self, records_path: Path, node: str) -> list[ProcessRecord]:
        return []

    def adopt(self, record: ProcessRecord) -> Workload:
        return HollowWorkload(self.runtime_s)

    def adopt_unrecorded(self, launch: Launch) -> Workload | None:
        return HollowWorkload(self.runtime_s)

    async def close(self) -> None:
        pass


# -- the record file ---------------------------------------------------------------------------

_records_decoder = msgspec.json.Decoder(list[ProcessRecord])
_records_encoder = msgspec.json.Encoder()


def load_records(path: Path) -> list[ProcessRecord]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return _records_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        # Only written by os.replace, so this is damage from outside: say so, start afresh.
        log.error("unreadable process records, ignored", path=str(path), error=str(e))
        return []


def save_records(path: Path, records: list[ProcessRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # 0600: the records hold every attempt's events token
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.format(_records_encoder.encode(records), indent=1))
    os.replace(tmp, path)
