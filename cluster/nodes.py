"""Nodes joining a cluster: `fairlane node start`, `node stop` and `node credentials`.

A node is one node executor (`python -m services.executor`) connected to the cluster's NATS as
its own user, `executor-<node>`, allowed only that node's subjects (services/runtime/auth.py).
Two ways in:

- **This machine's embedded cluster** (`fairlane up` in `--data-dir`): the node's user is added
  to the nats-server's config, which is then told to read it again (SIGHUP: nats-server
  reloads its users without dropping anyone connected), and the executor is added to the
  supervisor's plan (`supervisor-plan.json`), which the supervisor reads again on SIGHUP too:
  it restarts the node like any service, and `fairlane down` stops it with the rest. Its
  files are in `<data>/nodes/<node>/` and its log is `<data>/logs/executor-<node>.log`.
- **A cluster elsewhere** (`--nats URL --credentials FILE`, the file written for this node by
  `fairlane node credentials NODE` or `fairlane deploy secrets --node NODE`): a supervisor of
  the node's own runs the executor, with its plan, status, logs and data in
  `<data>/nodes/<node>/` (`node.json` says what runs there).

Several nodes on one machine each get their own folder (checkpoints, run files) and their own
declared GPUs (`--gpus N`: GPU indexes 0..N-1 of that node; without it the executor asks NVML,
for a node that has a machine, and its GPUs, to itself). Nothing is half-applied: a name
that is taken (a node of that name in the plan, or whose heartbeat is in the heartbeat bucket)
or a credentials file of another node is refused before anything changes, and a node whose
executor exits before it registers is taken out of the plan again.

`node stop` takes the executor out of the plan (or stops the node's own supervisor): the
executor stops its workloads as `fairlane down` does (SIGTERM, the jobs' grace, SIGKILL) and
reports nothing, its heartbeats stop, and the node watcher declares the node lost after its
heartbeat timeout (`fairlane up --heartbeat-timeout`); the node's jobs are queued again and
resume elsewhere from their last stored checkpoint. `fairlane node drain NODE` first moves
them with a checkpoint taken as they stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from cluster.cluster_file import ClusterFile, read_cluster
from cluster.detached import spawn_detached, stop_pid
from cluster.embedded import (
    SUPERVISOR,
    is_root,
    nats_flag_problem,
    private_data,
    server_pid,
)
from cluster.supervisor import STOP_GRACE_S, Plan, Program, read_plan, read_status
from services.runtime.auth import (
    ADMIN,
    CREDENTIALS_ENV,
    Credentials,
    credentials_dir,
    executor_user,
    load_credentials,
    node_of,
    write_auth,
)
from services.runtime.connection import NotAuthorized, connect
from services.runtime.eventlog import JetStreamLog
from services.runtime.heartbeats import BUCKET as HEARTBEATS
from services.runtime.processes import pid_exists

#: A node's name is a NATS subject token and a folder name (events bound names to 128).
NODE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
PLAN_FILE: Final = "supervisor-plan.json"
NATS_SERVER: Final = "nats-server"
NODE_FILE: Final = "node.json"
#: how long a node has to register once its executor was started
REGISTER_WITHIN_S: Final = 60.0
#: how long the nats-server has to take a user it was told to read again
RELOAD_WITHIN_S: Final = 10.0
Runtime = Literal["process", "docker"]


class NodeError(RuntimeError):
    """A node cannot be started or stopped; the message names the value (and its flag)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code  # 1: refused or failed; 2: a bad value


class NodeHost(msgspec.Struct, frozen=True):
    """`<data>/nodes/<node>/node.json`: a node run here for a cluster elsewhere."""

    node: str
    nats_url: str
    credentials: str
    supervisor_pid: int
    started_at: float


@dataclass(frozen=True, slots=True)
class StartedNode:
    node: str
    pool: str
    gpus: int | None  # None: what NVML finds
    nats_url: str
    log: Path
    data_dir: Path


# -- the pure part: names, programs, plans --------------------------------------------------------


def check_name(node: str) -> None:
    if not NODE_NAME.fullmatch(node):
        raise NodeError(
            f"node name {node!r}: use 1 to 128 letters, digits, '-' and '_', starting with a "
            "letter or digit (it names the node's NATS subjects and its folder)",
            code=2,
        )


def check_gpus(gpus: int | None) -> None:
    if gpus is not None and gpus < 0:
        raise NodeError(f"--gpus {gpus}: a node declares 0 or more GPUs", code=2)


def program_name(node: str) -> str:
    return f"executor-{node}"


def node_dir(data_dir: Path, node: str) -> Path:
    """Where a node started here keeps its files (its executor's data under `executor/`)."""
    return data_dir / "nodes" / node


def make_node_dir(data_dir: Path, node: str) -> Path:
    """The node's folder, made now: where we are root, others may pass through it and through
    `nodes/` (each job runs as a uid of its own and must reach its folders in the executor's)
    but list neither; else they are closed, as the rest of the data folder is."""
    folder = node_dir(data_dir, node)
    folder.mkdir(parents=True, exist_ok=True)
    for made in (folder.parent, folder):
        made.chmod(0o711 if is_root() else 0o700)
    return folder


def executor_args(  # noqa: PLR0913 (the executor's own flags)
    *,
    nats_url: str,
    node: str,
    pool: str,
    gpus: int | None,
    data_dir: Path,
    runtime: Runtime,
    address: str | None = None,
    same_user: bool = False,
) -> list[str]:
    """The executor's command line after the interpreter. Its workloads stop with it (as the
    embedded cluster's own node's do): a node that is stopped is gone, and what ran there
    resumes elsewhere, never twice. `same_user`: the cluster's own node runs its workloads as
    the cluster's user (`fairlane up --insecure-same-user`), so the nodes added to it do too."""
    args = ["-m", "services.executor", "--nats", nats_url, "--node", node, "--pool", pool]
    args += ["--data-dir", str(data_dir), "--runtime", runtime, "--stop-workloads-on-exit"]
    if gpus is not None:  # else the executor asks NVML
        args += ["--gpus", str(gpus)]
    if address is not None:
        args += ["--address", address]
    if same_user or os.geteuid() != 0:
        # as `fairlane up`: only root can give each job a user of its own; anyone else runs
        # a machine of their own, whose workloads run as themselves
        args += ["--insecure-same-user"]
    return args


def node_of_program(program: Program) -> str | None:
    """The node a supervised program is the executor of (None: not an executor)."""
    args = program.args
    if "services.executor" not in args or "--node" not in args:
        return None
    at = args.index("--node") + 1
    return args[at] if at < len(args) else None


def program_of(plan: Plan, node: str) -> Program | None:
    return next((p for p in plan.programs if node_of_program(p) == node), None)


def with_program(plan: Plan, program: Program) -> Plan:
    return msgspec.structs.replace(plan, programs=[*plan.programs, program])


def without_program(plan: Plan, name: str) -> Plan:
    return msgspec.structs.replace(plan, programs=[p for p in plan.programs if p.name != name])


def credentials_for(path: Path, node: str) -> Credentials:
    """The credentials in `path`, which must be `node`'s executor's."""
    try:
        creds = load_credentials(path)
    except OSError as e:
        raise NodeError(f"--credentials {path}: {e.strerror or e}", code=2) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise NodeError(
            f"--credentials {path}: not a NATS credentials file ({e})", code=2
        ) from None
    owner = node_of(creds)
    if owner != node:
        whose = f" (node {owner})" if owner else ""
        raise NodeError(
            f"--credentials {path} holds the NATS user {creds.user!r}{whose}, not node "
            f"{node}'s {executor_user(node)!r}: write this node's with `fairlane node "
            f"credentials {node}` on the cluster's machine (or `fairlane deploy secrets DIR "
            f"--node {node}`)",
            code=2,
        )
    return creds


# -- the shell ------------------------------------------------------------------------------------


def private_node(data_dir: Path, node: str) -> Path:
    """The folders of a node joining a cluster elsewhere, kept as `fairlane up` keeps its own
    (`private_data`): every file written from here on, by this process and the supervisor it
    starts, readable by its user alone (umask 077); the logs, which name every job the node
    runs, closed; the data folder and the node's passed through by the jobs' uids where we
    are root. With the caller's umask (022) a job could read the node's log and plan."""
    data_dir.mkdir(parents=True, exist_ok=True)
    private_data(data_dir)
    folder = make_node_dir(data_dir, node)
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    logs.chmod(0o700)
    return folder


@contextlib.contextmanager
def plan_lock(folder: Path) -> Iterator[None]:
    """One change to a folder's plan at a time (two `node start`s at once, say)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".plan.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_plan(path: Path, plan: Plan) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(plan))
    tmp.replace(path)


def _signal(pid: int, sig: signal.Signals, what: str) -> None:
    """Signal a process `cluster.json` names, after checking it is still that program where
    the system says (a process id can be reused once its process is gone)."""
    expected = NATS_SERVER if what == NATS_SERVER else "cluster.supervisor"
    with contextlib.suppress(OSError):  # no /proc here: the pid alone will do
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if expected.encode() not in command:
            raise NodeError(f"the {what} (pid {pid}) is not running")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise NodeError(f"the {what} (pid {pid}) is not running") from None


def _admin(info: ClusterFile) -> Credentials | None:
    if not info.credentials_dir:
        return None
    return load_credentials(Path(info.credentials_dir) / f"{ADMIN}.json")


async def _connect(url: str, credentials: Credentials | None, flag: str) -> Client:
    try:
        return await connect(url, "fairlane-node", retry_for=5.0, credentials=credentials)
    except NotAuthorized as e:
        raise NodeError(f"{flag}: {e}", code=2) from None
    except Exception as e:  # unreachable, a bad URL: all the same to the user
        raise NodeError(f"cannot reach NATS at {url}: {e or type(e).__name__}") from None


async def refuse_if_beating(nc: Client, node: str) -> None:
    """A node of this name is running somewhere if its heartbeat is in the bucket (its key
    lapses a few seconds after its executor stops; `node stop` removes it at once)."""
    try:
        bucket = await nc.jetstream().key_value(HEARTBEATS)
        await bucket.get(node)
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
        return
    raise NodeError(
        f"node name {node!r} is taken: a node of that name is running (its heartbeat is in "
        f"the cluster's {HEARTBEATS} bucket); stop it first (`fairlane node stop {node}` "
        "where it runs) or choose another name"
    )


async def _forget_heartbeat(nc: Client, node: str) -> None:
    """Remove a stopped node's heartbeat, so that its name is free again at once. The node
    watcher sees no heartbeat either way and declares the node lost after its timeout."""
    with contextlib.suppress(Exception):  # lapsing by itself does the same, a little later
        bucket = await nc.jetstream().key_value(HEARTBEATS)
        await bucket.delete(node)


async def add_node_user(data_dir: Path, info: ClusterFile, node: str) -> Path:
    """The node's NATS user in the embedded cluster's nats-server (kept if it is there), its
    credentials file; the server reads its users again (SIGHUP) and takes this one before
    this returns."""
    if not info.credentials_dir:
        raise NodeError(
            f"the cluster in {data_dir} uses a NATS server it did not start (fairlane up "
            "--nats): add the node's user to that server yourself (services/runtime/auth.py "
            "`permissions`), or for a compose deployment run `fairlane deploy secrets DIR "
            f"--node {node}`"
        )
    config = credentials_dir(data_dir) / "nats-server.conf"
    files = write_auth(data_dir, config, [info.node, node])
    path = files[executor_user(node)]
    # supervised: its pid is the one it runs with now (it changes when it is restarted)
    pid = server_pid(data_dir, NATS_SERVER) or info.pids.get(NATS_SERVER)
    if pid is None:
        raise NodeError(f"the cluster's {NATS_SERVER} is not running now: try again once it is")
    _signal(pid, signal.SIGHUP, NATS_SERVER)
    deadline = time.monotonic() + RELOAD_WITHIN_S
    while True:
        try:
            nc = await connect(info.nats_url, "fairlane-node", 2.0, load_credentials(path))
        except NotAuthorized:
            if time.monotonic() > deadline:
                raise NodeError(
                    f"nats-server did not take the user {executor_user(node)!r} within "
                    f"{RELOAD_WITHIN_S:g}s of reading its config again (see its log)"
                ) from None
            await asyncio.sleep(0.1)
            continue
        await nc.close()
        return path


async def node_credentials(data_dir: Path, node: str) -> tuple[Path, str]:
    """`fairlane node credentials`: the node's credentials file and the cluster's NATS URL."""
    check_name(node)
    data_dir = data_dir.resolve()
    info = read_cluster(data_dir)
    if info is None:
        raise NodeError(
            f"no cluster runs from {data_dir} (--data-dir); for a compose deployment, "
            f"`fairlane deploy secrets DIR --node {node}` writes the node's user"
        )
    return await add_node_user(data_dir, info, node), info.nats_url


async def start_node(  # noqa: PLR0913 (the `fairlane node start` options)
    data_dir: Path,
    node: str,
    *,
    gpus: int | None,
    pool: str = "default",
    runtime: Runtime = "process",
    address: str | None = None,
    within: float = REGISTER_WITHIN_S,
) -> StartedNode:
    """A node executor for the embedded cluster running from `data_dir`, supervised with its
    services; returns once the node has registered."""
    check_name(node)
    check_gpus(gpus)
    data_dir = data_dir.resolve()
    info = read_cluster(data_dir)
    if info is None:
        raise NodeError(
            f"no cluster runs from {data_dir} (--data-dir): start one with `fairlane up`, or "
            "join a cluster elsewhere with --nats URL --credentials FILE"
        )
    plan_file = data_dir / PLAN_FILE
    with plan_lock(data_dir):
        plan = read_plan(plan_file)
        taken = program_of(plan, node)
        if taken is not None:
            raise NodeError(
                f"node name {node!r} is taken: that node runs in the cluster in {data_dir} "
                f"(supervised as {taken.name}); `fairlane node stop {node}` first, or choose "
                "another name"
            )
        nc = await _connect(info.nats_url, _admin(info), "--data-dir")
        try:
            await refuse_if_beating(nc, node)
            before = await _registration_seq(nc, node)
            env = {}
            if info.credentials_dir:
                env = {CREDENTIALS_ENV: str(await add_node_user(data_dir, info, node))}
            folder = make_node_dir(data_dir, node)
            args = executor_args(
                nats_url=info.nats_url,
                node=node,
                pool=pool,
                gpus=gpus,
                data_dir=folder / "executor",
                runtime=runtime,
                address=address,
                same_user=any("--insecure-same-user" in p.args for p in plan.programs),
            )
            program = Program(program_name(node), args, env)
            write_plan(plan_file, with_program(plan, program))
            supervisor = info.pids[SUPERVISOR]
            _signal(supervisor, signal.SIGHUP, "cluster's supervisor")
            try:
                await _registered(nc, node, before, data_dir, program.name, within)
            except BaseException:  # not started after all: the plan goes back to what it was
                write_plan(plan_file, plan)
                with contextlib.suppress(NodeError):
                    _signal(supervisor, signal.SIGHUP, "cluster's supervisor")
                await _forget_heartbeat(nc, node)  # one it sent before failing: the name is free
                raise
        finally:
            await nc.close()
    log = data_dir / "logs" / f"{program.name}.log"
    return StartedNode(node, pool, gpus, info.nats_url, log, folder)


async def _registration_seq(nc: Client, node: str) -> int:
    last = await JetStreamLog(nc).last_on(f"fl.node.{node}.node_registered")
    return last.seq if last is not None else 0


async def _registered(  # noqa: PLR0913 (what it waits for, and where to look when it fails)
    nc: Client, node: str, after: int, data_dir: Path, program: str, within: float
) -> None:
    """Until the node registers anew (its executor reconciles first), or its executor exits
    (the supervisor says so: its log's tail is the reason)."""
    deadline = time.monotonic() + within
    while True:
        await asyncio.sleep(0.2)
        if await _registration_seq(nc, node) > after:
            return
        status = read_status(data_dir / "supervisor-status.json")
        mine = status.programs.get(program) if status is not None else None
        if mine is not None and mine.restarts > 0:
            raise NodeError(
                f"node {node!r}: its executor exited (status {mine.last_exit}) before it "
                f"registered, and is out of the plan again. Its log, {data_dir}/logs/"
                f"{program}.log, ends:\n" + _tail(data_dir / "logs" / f"{program}.log")
            )
        if time.monotonic() > deadline:
            raise NodeError(
                f"node {node!r} did not register within {within:g}s, and is out of the plan again "
                f"(its log: {data_dir}/logs/{program}.log)"
            )


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def start_remote_node(  # noqa: PLR0913 (the `fairlane node start` options)
    data_dir: Path,
    node: str,
    *,
    nats_url: str,
    credentials: Path,
    gpus: int | None,
    pool: str = "default",
    runtime: Runtime = "process",
    address: str | None = None,
    within: float = REGISTER_WITHIN_S,
) -> StartedNode:
    """A node executor here for the cluster at `nats_url`, under a supervisor of its own;
    returns once the node has registered (its executor's log says so: its NATS user may not
    read the log)."""
    check_name(node)
    check_gpus(gpus)
    problem = nats_flag_problem(nats_url)
    if problem is not None:
        raise NodeError(problem, code=2)
    credentials = credentials.resolve()
    creds = credentials_for(credentials, node)
    folder = node_dir(data_dir.resolve(), node)
    host = read_node_host(folder)
    if host is not None:
        raise NodeError(
            f"node name {node!r} is taken: it runs from {folder} (supervisor pid "
            f"{host.supervisor_pid}); `fairlane node stop {node}` first, or choose another name"
        )
    nc = await _connect(nats_url, creds, f"--credentials {credentials}")
    try:
        await refuse_if_beating(nc, node)
    finally:
        await nc.close()
    private_node(data_dir.resolve(), node)
    args = executor_args(
        nats_url=nats_url,
        node=node,
        pool=pool,
        gpus=gpus,
        data_dir=folder / "executor",
        runtime=runtime,
        address=address,
    )
    name = program_name(node)
    plan = Plan(
        programs=[Program(name, args, {CREDENTIALS_ENV: str(credentials)})],
        log_dir=str(folder / "logs"),
        status_file=str(folder / "supervisor-status.json"),
    )
    write_plan(folder / PLAN_FILE, plan)
    (folder / "supervisor-status.json").unlink(missing_ok=True)
    log = folder / "logs" / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0
    supervisor = ["-m", "cluster.supervisor", "--plan", str(folder / PLAN_FILE)]
    pid = await spawn_detached(SUPERVISOR, supervisor, folder)
    host = NodeHost(node, nats_url, str(credentials), pid, time.time())
    (folder / NODE_FILE).write_bytes(msgspec.json.encode(host))
    try:
        await _logged_registration(log, offset, folder, name, node, within)
    except BaseException:
        await stop_pid(pid, STOP_GRACE_S + 5)
        (folder / NODE_FILE).unlink(missing_ok=True)
        raise
    return StartedNode(node, pool, gpus, nats_url, log, folder)


async def _logged_registration(  # noqa: PLR0913
    log: Path, offset: int, folder: Path, program: str, node: str, within: float
) -> None:
    deadline = time.monotonic() + within
    while True:
        await asyncio.sleep(0.2)
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(offset)
            if b'"event": "node registered"' in f.read():
                return
        status = read_status(folder / "supervisor-status.json")
        mine = status.programs.get(program) if status is not None else None
        if mine is not None and mine.restarts > 0:
            raise NodeError(
                f"node {node!r}: its executor exited (status {mine.last_exit}) before it "
                f"registered; its supervisor is stopped. Its log, {log}, ends:\n" + _tail(log)
            )
        if time.monotonic() > deadline:
            raise NodeError(f"node {node!r} did not register within {within:g}s (its log: {log})")


def read_node_host(folder: Path) -> NodeHost | None:
    """The node run from `folder` for a cluster elsewhere, if its supervisor still runs."""
    try:
        host = msgspec.json.decode((folder / NODE_FILE).read_bytes(), type=NodeHost)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return host if pid_exists(host.supervisor_pid) else None


async def stop_node(data_dir: Path, node: str) -> str:
    """Stop a node started from `data_dir` (the embedded cluster's, its own node included, or
    one run here for a cluster elsewhere); returns where it ran."""
    check_name(node)
    data_dir = data_dir.resolve()
    info = read_cluster(data_dir)
    if info is not None:
        with plan_lock(data_dir):
            plan = read_plan(data_dir / PLAN_FILE)
            program = program_of(plan, node)
            if program is not None:
                write_plan(data_dir / PLAN_FILE, without_program(plan, program.name))
                _signal(info.pids[SUPERVISOR], signal.SIGHUP, "cluster's supervisor")
                await _dropped(data_dir, program.name)
                nc = await _connect(info.nats_url, _admin(info), "--data-dir")
                try:
                    await _forget_heartbeat(nc, node)
                finally:
                    await nc.close()
                return f"the cluster in {data_dir}"
    folder = node_dir(data_dir, node)
    host = read_node_host(folder)
    if host is None:
        raise NodeError(f"no node named {node!r} runs from {data_dir} (--data-dir)")
    await stop_pid(host.supervisor_pid, STOP_GRACE_S + 5)
    with contextlib.suppress(Exception):
        creds = load_credentials(Path(host.credentials))
        nc = await connect(host.nats_url, "fairlane-node", 5.0, creds)
        try:
            await _forget_heartbeat(nc, node)
        finally:
            await nc.close()
    (folder / NODE_FILE).unlink(missing_ok=True)
    return f"{folder}, for the cluster at {host.nats_url}"


async def _dropped(data_dir: Path, program: str) -> None:
    """Until the supervisor has stopped `program` (it gives it STOP_GRACE_S, then SIGKILL)."""
    deadline = time.monotonic() + STOP_GRACE_S + 10
    while time.monotonic() < deadline:
        status = read_status(data_dir / "supervisor-status.json")
        if status is None or program not in status.programs:
            return
        await asyncio.sleep(0.1)
    raise NodeError(f"the cluster's supervisor did not stop {program} in time")
