"""The embedded cluster: everything Fairlane needs on one machine, from its own wheels.

`fairlane up` starts nats-server (JetStream) and PostgreSQL under a data folder, the services
as child processes, and one node executor for this machine; `fairlane down` (or Ctrl-C on a
foreground `up`) stops them all. What runs where is written to `<data>/cluster.json`, so
`down`, the job commands and the demo find a running cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import msgspec

from services.api.tokens import admin_token_file
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.servers import NatsServer, Postgres, free_port

SERVICES = ("admission", "ledger", "scheduler", "preemptor", "nodewatch")
DEFAULT_DATA_DIR = Path(".fairlane")
DEFAULT_NATS_PORT = 4222
DEFAULT_API_PORT = 8080


class ClusterFile(msgspec.Struct):
    nats_url: str
    postgres_uri: str
    data_dir: str
    node: str
    #: process ids of what this cluster started and must stop (nats-server included)
    pids: dict[str, int]
    started_at: float
    #: the HTTP API, and the file holding its admin token (mode 0600)
    api_url: str = ""
    admin_token_file: str = ""


class EmbeddedError(RuntimeError):
    pass


def cluster_file(data_dir: Path) -> Path:
    return data_dir / "cluster.json"


def read_cluster(data_dir: Path) -> ClusterFile | None:
    """The running cluster recorded in `data_dir`, or None if none runs there."""
    path = cluster_file(data_dir)
    try:
        info = msgspec.json.decode(path.read_bytes(), type=ClusterFile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not any(_alive(pid) for pid in info.pids.values()):
        return None
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def up(
    data_dir: Path,
    gpus: int | None = None,
    nats_url: str | None = None,
    postgres_dsn: str | None = None,
    runtime: str = "process",
) -> ClusterFile:
    """Start what is missing and return where everything listens."""
    data_dir = data_dir.resolve()
    running = read_cluster(data_dir)
    if running is not None:
        raise EmbeddedError(f"a cluster already runs from {data_dir} (nats {running.nats_url})")
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    pids: dict[str, int] = {}
    if nats_url is None:
        port = DEFAULT_NATS_PORT if _port_free(DEFAULT_NATS_PORT) else free_port()
        server = NatsServer(store_dir=data_dir / "nats", port=port)
        await server.start()
        assert server.process is not None
        pids["nats-server"] = server.process.pid
        nats_url = server.url
    if postgres_dsn is None:
        postgres = Postgres(data_dir / "postgres")
        await postgres.start()
        postgres_dsn = postgres.uri
    for name in SERVICES:
        pids[name] = await _spawn(name, ["-m", f"services.{name}", "--nats", nats_url], data_dir)
    node = socket.gethostname().split(".")[0] or "local"
    executor = ["-m", "services.executor", "--nats", nats_url, "--node", node]
    executor += ["--pool", "default", "--data-dir", str(data_dir / "executor")]
    executor += ["--stop-workloads-on-exit"]  # `fairlane down` stops the workloads too
    executor += ["--runtime", runtime]
    if gpus is not None:
        executor += ["--gpus", str(gpus)]
    pids["executor"] = await _spawn("executor", executor, data_dir)
    api_url, token_file = await _start_read_side(data_dir, nats_url, postgres_dsn, pids)
    info = ClusterFile(
        nats_url=nats_url,
        postgres_uri=postgres_dsn,
        data_dir=str(data_dir),
        node=node,
        pids=pids,
        started_at=time.time(),
        api_url=api_url,
        admin_token_file=str(token_file),
    )
    cluster_file(data_dir).write_bytes(msgspec.json.encode(info))
    await _node_registered(nats_url, node)
    return info


async def _start_read_side(
    data_dir: Path, nats_url: str, postgres_dsn: str, pids: dict[str, int]
) -> tuple[str, Path]:
    """The projector and the HTTP API; the admin token is made here (only its owner may read
    the file) so that `up` can say where it is before the API has started."""
    token_file = data_dir / "admin-token"
    admin_token_file(token_file)
    common = ["--nats", nats_url, "--postgres", postgres_dsn]
    pids["projector"] = await _spawn("projector", ["-m", "services.projector", *common], data_dir)
    port = DEFAULT_API_PORT if _port_free(DEFAULT_API_PORT) else free_port()
    api = ["-m", "services.api", *common, "--port", str(port)]
    api += ["--admin-token-file", str(token_file)]
    pids["api"] = await _spawn("api", api, data_dir)
    return f"http://127.0.0.1:{port}", token_file


async def down(data_dir: Path) -> list[str]:
    """Stop everything the cluster in `data_dir` started; returns what was stopped."""
    data_dir = data_dir.resolve()
    path = cluster_file(data_dir)
    try:
        info = msgspec.json.decode(path.read_bytes(), type=ClusterFile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        info = None
    stopped: list[str] = []
    if info is not None:
        order = [n for n in info.pids if n != "nats-server"] + ["nats-server"]
        for name in order:
            pid = info.pids.get(name)
            if pid is not None and await _stop(pid):
                stopped.append(name)
    postgres = Postgres(data_dir / "postgres")
    if (postgres.data_dir / "postmaster.pid").exists():
        await postgres.stop()
        stopped.append("postgres")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return stopped


async def _spawn(name: str, args: list[str], data_dir: Path) -> int:
    log = (data_dir / "logs" / f"{name}.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log.close()
    return process.pid


async def _stop(pid: int, grace_s: float = 10.0) -> bool:
    if not _alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(pid) or _reaped(pid):
            return True
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def _reaped(pid: int) -> bool:
    """Reap our own child if it exited (a zombie still answers kill(pid, 0))."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _node_registered(nats_url: str, node: str, within: float = 30.0) -> None:
    """Wait until this machine's node executor has registered its node (it reconciles what
    runs there first): before that, every job would be refused for want of nodes."""
    log = JetStreamLog(await connect(nats_url, "fairlane-up"))
    try:
        deadline = time.monotonic() + within
        while await log.last_on(f"fl.node.{node}.node_registered") is None:
            if time.monotonic() > deadline:
                raise EmbeddedError(f"the node executor for {node!r} did not register in time")
            await asyncio.sleep(0.1)
    finally:
        await log.nc.close()
