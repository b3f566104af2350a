"""The embedded cluster: everything Fairlane needs on one machine, from its own wheels.

`fairlane up` starts nats-server (JetStream) and PostgreSQL under a data folder, the services
and one node executor for this machine, all under a supervisor that restarts whatever exits
(cluster/supervisor.py): the servers first, the services once the stream exists. JetStream
is sized to the disk it is on (`store_sizes`). `fairlane down` (or Ctrl-C on a foreground
`up`) stops them all.
`fairlane node start` adds more nodes to the supervisor's plan (cluster/nodes.py).
What runs where is written to `<data>/cluster.json`, so `down`, the job commands and the demo
find a running cluster.

The nats-server it starts takes only authenticated users, each service its own with only its
own subjects (services/runtime/auth.py): the credentials are generated into
`<data>/credentials/` (0600), the stream and buckets are created by the admin user before any
service starts, and each program is told its own credentials file, never the password.

The data folder is the cluster's user's alone (docs/operations.md, "What a tenant can
reach"): 0711 where that user is root (PostgreSQL's user and the workloads, each a uid of its
own, pass through to their own folders, and list nothing), 0700 otherwise; everything the
services write in it is created under umask 077. PostgreSQL takes the password in
`<data>/postgres.password`, which the projector and the API get in their environment, not on
their command line (anyone may read another user's command line). As root the node's
workloads run as users of their own; a cluster started by anyone else runs them as itself
(`--insecure-same-user`, said by `fairlane up`), which only suits a machine of one person.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Final, NamedTuple

import msgspec
import nats

from cluster.cluster_file import (
    ClusterFile,
    cluster_file,
    read_cluster,
)
from cluster.detached import spawn_detached, stop_pid
from cluster.provision import DEFAULT_MAX_BYTES, provision
from cluster.servers import (
    NatsServer,
    Postgres,
    ServerError,
    free_port,
    go_threads,
    nats_server_binary,
)
from cluster.supervisor import (
    NATS_SERVER,
    STARTUP_S,
    Plan,
    Program,
    ProgramStatus,
    read_status,
    stop_within,
)
from services.api.tokens import admin_token_file
from services.nodewatch.service import TIMEOUT_ENV
from services.runtime.auth import (
    ADMIN,
    CREDENTIALS_ENV,
    credentials_dir,
    executor_user,
    load_credentials,
    write_auth,
)
from services.runtime.connection import connect, url_problem
from services.runtime.eventlog import JetStreamLog
from services.runtime.logstream import DEFAULT_LOG_MAX_BYTES
from services.runtime.postgres import DSN_ENV

SERVICES = ("admission", "ledger", "scheduler", "preemptor", "nodewatch")
SUPERVISOR = "supervisor"
PLAN_FILE = "supervisor-plan.json"
#: The services' instance number: the same across restarts, so their durable consumers are
#: reused, not left behind one per process.
INSTANCE = "0"
POSTGRES = "postgres"
DEFAULT_NATS_PORT = 4222
DEFAULT_API_PORT = 8080
#: How long an executor may take to stop its workloads on `down`: their grace period (the
#: cluster's default is 30 s), storing what they saved, and the reports.
EXECUTOR_STOP_GRACE_S = 90.0


class EmbeddedError(RuntimeError):
    pass


async def up(  # noqa: PLR0913, PLR0915 (the `fairlane up` options, in the order they start)
    data_dir: Path,
    gpus: int | None = None,
    nats_url: str | None = None,
    postgres_dsn: str | None = None,
    runtime: str = "process",
    nats_port: int | None = None,
    api_port: int | None = None,
    heartbeat_timeout: float | None = None,
    insecure_same_user: bool | None = None,
) -> ClusterFile:
    """Start what is missing and return where everything listens (nats-server and the API
    on their default ports where free, else on free ones, unless told which). A node whose
    heartbeat lapses for `heartbeat_timeout` seconds is lost (default: the node watcher's)."""
    data_dir = data_dir.resolve()
    running = read_cluster(data_dir)
    if running is not None:
        raise EmbeddedError(f"a cluster already runs from {data_dir} (nats {running.nats_url})")
    if nats_url is not None:
        await _reachable(nats_url)
    # where it is not root it cannot give workloads users of their own (`fairlane up` says so)
    same_user = not is_root() if insecure_same_user is None else insecure_same_user
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    private_data(data_dir)
    sizes: StoreSizes | None = None
    pids: dict[str, int] = {}
    node = socket.gethostname().split(".")[0] or "local"
    files: dict[str, Path] = {}
    servers: list[Program] = []
    server: NatsServer | None = None
    if nats_url is None:
        sizes = store_sizes(data_dir)  # before anything starts: it may refuse a small disk
        port = nats_port or (DEFAULT_NATS_PORT if _port_free(DEFAULT_NATS_PORT) else free_port())
        auth = credentials_dir(data_dir) / "nats-server.conf"
        files = write_auth(data_dir, auth, [node])
        server = NatsServer(store_dir=data_dir / "nats", port=port, config=_limits(auth, sizes))
        binary = str(nats_server_binary())
        threads = go_threads(os.environ, os.cpu_count())
        servers.append(
            Program(NATS_SERVER, server.arguments(), executable=binary, stop_last=True, env=threads)
        )
        nats_url = server.url
    url: str = nats_url  # (for the closure below)
    postgres = Postgres(data_dir / "postgres")
    own_postgres = postgres_dsn is None
    if postgres_dsn is None:
        postgres.uri_file.unlink(missing_ok=True)
        keeper = ["-m", "cluster.servers", "postgres", str(postgres.data_dir)]
        servers.append(Program(POSTGRES, keeper, stop_last=True))
    plan_file = data_dir / PLAN_FILE

    def plan(programs: list[Program]) -> Plan:
        return Plan(
            programs=programs,
            log_dir=str(data_dir / "logs"),
            status_file=str(supervisor_status_file(data_dir)),
            nats_url=url if files else None,
            admin_credentials=str(files[ADMIN]) if files else None,
            jetstream_store=str(server.store_dir) if server is not None else None,
        )

    # the servers first, under the supervisor, so that it restarts them like any service;
    # the services join once the stream is provisioned (a service may not create it)
    write_private(plan_file, msgspec.json.encode(plan(servers)))  # the programs' environments
    supervisor_status_file(data_dir).unlink(missing_ok=True)
    supervisor = ["-m", "cluster.supervisor", "--plan", str(plan_file)]
    pids[SUPERVISOR] = await spawn_detached(SUPERVISOR, supervisor, data_dir)

    def env(user: str) -> dict[str, str]:
        return {CREDENTIALS_ENV: str(files[user])} if files else {}

    try:
        postgres_dsn = await _servers_up(data_dir, server, sizes, files, postgres_dsn)
        private_data(data_dir)  # again: the PostgreSQL wheel opens the folders above its own
        programs = _services(url, heartbeat_timeout, env)
        programs.append(_executor(data_dir, url, node, runtime, gpus, same_user, env))
        api_url, token_file = _read_side(
            data_dir, url, postgres_dsn, programs, env, api_port, runtime
        )
        write_private(plan_file, msgspec.json.encode(plan([*servers, *programs])))
        os.kill(pids[SUPERVISOR], signal.SIGHUP)  # it reads the plan again: the services join
        await _planned(data_dir, [p.name for p in programs])
        info = ClusterFile(
            nats_url=url,
            postgres_uri=postgres_dsn,
            data_dir=str(data_dir),
            node=node,
            pids=pids,
            started_at=time.time(),
            api_url=api_url,
            admin_token_file=str(token_file),
            credentials_dir=str(credentials_dir(data_dir)) if files else "",
        )
        write_private(cluster_file(data_dir), msgspec.json.encode(info))  # the DSN's password
        await _node_registered(url, node, files[ADMIN] if files else None, data_dir)
        if own_postgres:  # (the API waits for a PostgreSQL given to it, however long)
            await _listening(api_url, token_file, data_dir)
    except Exception as e:  # leave nothing running: the supervisor stops what it runs
        await stop_pid(pids[SUPERVISOR], 25.0)
        if postgres.pid() is not None:  # (should the keeper have been killed)
            await postgres.stop()
        cluster_file(data_dir).unlink(missing_ok=True)
        why = str(e) if isinstance(e, EmbeddedError | ServerError) else repr(e)
        raise EmbeddedError(f"{why} (everything started was stopped again)") from e
    return info


async def _servers_up(
    data_dir: Path,
    server: NatsServer | None,
    sizes: StoreSizes | None,
    files: dict[str, Path],
    postgres_dsn: str | None,
) -> str:
    """Wait for the servers the supervisor starts and provision the stream; returns the
    PostgreSQL DSN."""
    status = supervisor_status_file(data_dir)
    deadline = time.monotonic() + 15.0
    while read_status(status) is None:  # its signal handlers are set once it has said so
        if time.monotonic() > deadline:
            raise EmbeddedError(f"the supervisor did not start; see {data_dir}/logs/supervisor.log")
        await asyncio.sleep(0.05)
    if server is not None and sizes is not None:
        await _server_up(data_dir, server)
        try:
            async with asyncio.timeout(30.0):
                admin = await connect(
                    server.url, "fairlane-up", 10.0, load_credentials(files[ADMIN])
                )
                try:
                    await provision(
                        admin.jetstream(),
                        sizes.events,
                        log_max_bytes=sizes.logs,
                        relay_max_bytes=sizes.relays,
                    )
                finally:
                    await admin.close()
        except TimeoutError:
            raise EmbeddedError(f"nats-server at {server.url} did not answer within 30s") from None
    if postgres_dsn is None:
        postgres_dsn = await _postgres_up(data_dir, Postgres(data_dir / POSTGRES))
    return postgres_dsn


def _services(
    nats_url: str, heartbeat_timeout: float | None, env: Callable[[str], dict[str, str]]
) -> list[Program]:
    return [
        Program(
            name,
            ["-m", f"services.{name}", "--nats", nats_url, "--instance", INSTANCE],
            {**env(name), **_settings(name, heartbeat_timeout)},
        )
        for name in SERVICES
    ]


class StoreSizes(NamedTuple):
    """What the event log may take of the disk it is on (bytes)."""

    store: int  # JetStream's whole file store (nats-server's max_file_store)
    events: int  # the event stream's max_bytes
    relays: int  # the relay stream's max_bytes (each node's work: services/runtime/relays.py)
    logs: int  # the workloads' output stream's max_bytes


#: The share of the free space (plus what the store already holds) that JetStream may take:
#: the rest is for PostgreSQL, the logs and the jobs' own files.
STORE_SHARE: Final = 0.5
#: Below this much for JetStream the event log would be full after a few hundred jobs.
MIN_STORE_BYTES: Final = 64 << 20


def store_sizes(data_dir: Path) -> StoreSizes:
    """Size the event log to the disk under `data_dir`: STORE_SHARE of what is free (and
    what the store already holds), the event stream 50% of that and the relay stream 30% (a
    job's relays take about as many bytes as its events: each carries the event it relays), at
    most their default; or
    EmbeddedError naming how much is needed and how much is free."""
    where = data_dir / "nats" if (data_dir / "nats").is_dir() else data_dir  # a disk of its own?
    free = shutil.disk_usage(where).free
    store = int((free + _size_of(data_dir / "nats")) * STORE_SHARE)
    if store < MIN_STORE_BYTES:
        need = int(MIN_STORE_BYTES / STORE_SHARE)
        raise EmbeddedError(
            f"not enough disk space for the event log in {data_dir}: {_mib(free)} free, "
            f"{_mib(need)} needed ({STORE_SHARE:.0%} of the free space goes to JetStream, at "
            f"least {_mib(MIN_STORE_BYTES)}); free some space or choose another --data-dir"
        )
    events = min(DEFAULT_MAX_BYTES, int(store * 0.5))
    relays = min(DEFAULT_MAX_BYTES, int(store * 0.3))
    logs = min(DEFAULT_LOG_MAX_BYTES, int(store * 0.1))
    return StoreSizes(store=store, events=events, relays=relays, logs=logs)


def _size_of(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


def _mib(size: float) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def _limits(auth: Path, sizes: StoreSizes) -> Path:
    """nats-server's config: JetStream's store bounded to `sizes.store` (else it takes 75% of
    the disk, and refuses the stream's limits on a small one), and the users from `auth`
    (included, so that `fairlane node start` rewrites them and a SIGHUP reloads both)."""
    config = auth.with_name("nats-server-main.conf")
    text = f"jetstream {{\n  max_file_store: {sizes.store}\n}}\ninclude ./{auth.name}\n"
    config.touch(mode=0o600)
    config.write_text(text)
    return config


async def _listening(api_url: str, token_file: Path, data_dir: Path, within: float = 30.0) -> None:
    """Wait until the API answers, so that a command right after `up` reaches it; one that
    does not within `within` seconds is left to `started` to report.

    An API there that refuses this cluster's admin token is another cluster's: two `up`s that
    found the default port free at the same moment, or a port given that another cluster
    holds. This one's API could not listen, and every command would have gone to the other
    ("unknown API token"). Asked before looking whether the API exited, so that `up` says
    which, whenever the other answers."""
    host, port = api_url.removeprefix("http://").rsplit(":", 1)
    token = token_file.read_text().strip()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            status = await _whoami_status(host, int(port), token)
        except (OSError, TimeoutError):
            if _exited(data_dir, "api"):
                return
            await asyncio.sleep(0.1)
            continue
        if status == HTTPStatus.UNAUTHORIZED:
            raise EmbeddedError(
                f"port {port} answers for another Fairlane cluster's API (it refused this "
                "cluster's admin token): stop that cluster, or give this one another --api-port"
            )
        return


async def _whoami_status(host: str, port: int, token: str) -> int:
    """The HTTP status of `GET /v1/whoami` with this token (0 if the answer is not HTTP)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        request = (
            f"GET /v1/whoami HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        writer.write(request.encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5.0)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def _planned(data_dir: Path, names: list[str], within: float = 15.0) -> None:
    """Wait until the supervisor has taken the services into its plan (`started` waits on
    what its status lists)."""
    deadline = time.monotonic() + within
    while not set(names) <= {p.name for p in supervisor_status(data_dir)}:
        if time.monotonic() > deadline:
            raise EmbeddedError(f"the supervisor did not start the services; see {data_dir}/logs")
        await asyncio.sleep(0.05)


async def _server_up(data_dir: Path, server: NatsServer, within: float = 20.0) -> None:
    log = f"see {data_dir}/logs/{NATS_SERVER}.log"
    await server.listening(within, lambda: _failing(data_dir, NATS_SERVER), log)


async def _postgres_up(data_dir: Path, postgres: Postgres, within: float = 90.0) -> str:
    """The URI its keeper writes once PostgreSQL takes connections."""
    deadline = time.monotonic() + within
    while not postgres.uri_file.exists():
        if _failing(data_dir, POSTGRES) or time.monotonic() > deadline:
            raise EmbeddedError(f"PostgreSQL did not start; see {data_dir}/logs/{POSTGRES}.log")
        await asyncio.sleep(0.1)
    return postgres.uri_file.read_text()


def server_pid(data_dir: Path, name: str) -> int | None:
    """The process id of a supervised server now (it changes when one is restarted)."""
    for program in supervisor_status(data_dir):
        if program.name == name and program.state == "running":
            return program.pid
    return None


def _executor(  # noqa: PLR0913 (the executor's own flags)
    data_dir: Path,
    nats_url: str,
    node: str,
    runtime: str,
    gpus: int | None,
    same_user: bool,
    env: Callable[[str], dict[str, str]],
) -> Program:
    """This machine's node executor: stopped first (`fairlane down` stops its workloads as a
    preemption does, and it reports them through the log while the services still run)."""
    return Program(
        "executor",
        _executor_args(data_dir, nats_url, node, runtime, gpus, same_user),
        env(executor_user(node)),
        stop_first=True,
        stop_grace_s=EXECUTOR_STOP_GRACE_S,
    )


def _executor_args(  # noqa: PLR0913 (the executor's own flags)
    data_dir: Path,
    nats_url: str,
    node: str,
    runtime: str,
    gpus: int | None,
    insecure_same_user: bool,
) -> list[str]:
    executor = ["-m", "services.executor", "--nats", nats_url, "--node", node]
    executor += ["--pool", "default", "--data-dir", str(data_dir / "executor")]
    # `fairlane down` stops the workloads as a preemption does: they are queued again
    executor += ["--shutdown-on-exit"]
    executor += ["--runtime", runtime]
    if insecure_same_user:
        executor += ["--insecure-same-user"]
    if gpus is not None:
        executor += ["--gpus", str(gpus)]
    return executor


def _settings(service: str, heartbeat_timeout: float | None) -> dict[str, str]:
    """A service's own settings from `up`'s options: the node watcher's heartbeat timeout."""
    if service == "nodewatch" and heartbeat_timeout is not None:
        return {TIMEOUT_ENV: f"{heartbeat_timeout:g}"}
    return {}


def _read_side(  # noqa: PLR0913 (where each part of the read side runs)
    data_dir: Path,
    nats_url: str,
    postgres_dsn: str,
    programs: list[Program],
    env: Callable[[str], dict[str, str]],
    api_port: int | None = None,
    runtime: str | None = None,
) -> tuple[str, Path]:
    """The projector and the HTTP API, supervised like the services; the admin token is made
    here (only its owner may read the file) so that `up` can say where it is before the API
    has started."""
    token_file = data_dir / "admin-token"
    admin_token_file(token_file)
    common = ["--nats", nats_url]
    dsn = {DSN_ENV: postgres_dsn}  # not an argument: every user may read those
    projector = ["-m", "services.projector", *common]
    programs.append(Program("projector", projector, {**env("projector"), **dsn}))
    port = api_port or (DEFAULT_API_PORT if _port_free(DEFAULT_API_PORT) else free_port())
    api = ["-m", "services.api", *common, "--port", str(port)]
    api += ["--admin-token-file", str(token_file)]
    if runtime in ("process", "docker"):  # its one node runs them so: the API refuses images
        api += ["--node-runtime", runtime]
    programs.append(Program("api", api, {**env("api"), **dsn}))
    return f"http://127.0.0.1:{port}", token_file


def is_root() -> bool:
    return os.geteuid() == 0


def private_data(data_dir: Path) -> None:
    """The data folder as only the cluster's user may read it: where that is root, others may
    pass through (PostgreSQL's own user to its folder, workloads to theirs) but list nothing,
    and the folders of the servers and the logs are closed; no file in it is readable by
    others (umask 077 for everything started from here, explicit modes for what `up`
    writes)."""
    os.umask(0o077)
    data_dir.chmod(0o711 if is_root() else 0o700)
    for name in ("logs", "nats"):
        with contextlib.suppress(FileNotFoundError):
            (data_dir / name).chmod(0o700)


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file of another mode keeps it through O_TRUNC
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _exited(data_dir: Path, program: str) -> bool:
    return any(p.name == program and p.restarts > 0 for p in supervisor_status(data_dir))


def _failing(data_dir: Path, program: str, tries: int = 3) -> bool:
    """A server that failed `tries` times (a first failure may pass: the supervisor starts it
    again, and PostgreSQL's folder permissions, say, are set again on each start)."""
    return any(p.name == program and p.restarts >= tries for p in supervisor_status(data_dir))


def supervisor_status_file(data_dir: Path) -> Path:
    return data_dir / "supervisor-status.json"


def supervisor_status(data_dir: Path) -> list[ProgramStatus]:
    """What each supervised program is doing now (empty if no supervisor has said yet)."""
    status = read_status(supervisor_status_file(data_dir.resolve()))
    return list(status.programs.values()) if status is not None else []


def limit_warnings(data_dir: Path) -> list[str]:
    status = read_status(supervisor_status_file(data_dir.resolve()))
    return status.warnings if status is not None else []


async def started(data_dir: Path, within: float = STARTUP_S + 10.0) -> list[ProgramStatus]:
    """Wait until every program has run for STARTUP_S, or one has exited; returns those that
    exited since `up` started them (each is being restarted, with backoff)."""
    deadline = time.monotonic() + within
    while True:
        programs = supervisor_status(data_dir)
        # a server running again is up: `up` waited for it to take connections (its first
        # start may fail where another process meddles with its folder, and be retried)
        failed = [p for p in programs if p.restarts > 0 and not _server_running(p)]
        settled = programs and all(
            p.state == "running" and time.time() - p.started_at >= STARTUP_S for p in programs
        )
        if failed or settled or time.monotonic() > deadline:
            return failed
        await asyncio.sleep(0.2)


def _server_running(program: ProgramStatus) -> bool:
    return program.name in (NATS_SERVER, POSTGRES) and program.state == "running"


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
        order = [n for n in info.pids if n != NATS_SERVER] + [NATS_SERVER]
        for name in order:
            pid = info.pids.get(name)
            # the supervisor stops its programs first (the executors before the rest, which
            # they report through): give it their grace as well
            grace = _supervisor_grace(data_dir) if name == SUPERVISOR else 10.0
            if name == SUPERVISOR:
                stopped += [p.name for p in supervisor_status(data_dir) if p.state == "running"]
            if pid is not None and await stop_pid(pid, grace):
                stopped.append(name)
            if name == SUPERVISOR:  # and anything it left behind (it was killed, say)
                for program in supervisor_status(data_dir):
                    if program.pid is not None and await stop_pid(program.pid):
                        stopped.append(program.name)
    postgres = Postgres(data_dir / "postgres")
    if postgres.pid() is not None:  # its keeper was killed, say: the server outlived it
        await postgres.stop()
        stopped.append(POSTGRES)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return stopped


def _supervisor_grace(data_dir: Path) -> float:
    """How long the supervisor may take to stop, from its plan (a margin added)."""
    try:
        plan = msgspec.json.decode((data_dir / PLAN_FILE).read_bytes(), type=Plan)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return 25.0
    return stop_within(plan) + 5.0


def nats_flag_problem(nats_url: str) -> str | None:
    """`--nats URL` refused as a bad value, flag and value named, where no client could use
    the URL (None: it may be tried)."""
    problem = url_problem(nats_url)
    return None if problem is None else f"--nats {nats_url}: {problem}"


async def _reachable(nats_url: str, within: float = 5.0) -> None:
    """Refuse a NATS server that cannot be reached before starting anything, rather than
    leave services retrying against it (nats-py itself retries a first connection forever)."""

    async def quiet(_: Exception) -> None:
        pass

    try:
        async with asyncio.timeout(within):
            nc = await nats.connect(
                nats_url, connect_timeout=2, allow_reconnect=False, error_cb=quiet
            )
    except Exception as e:  # unreachable, refused, a bad URL: all the same to the user
        why = f"no answer within {within:g}s" if isinstance(e, TimeoutError) else str(e)
        raise EmbeddedError(f"cannot reach NATS at {nats_url}: {why}") from None
    await nc.close()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _node_registered(
    nats_url: str, node: str, admin_file: Path | None, data_dir: Path, within: float = 30.0
) -> None:
    """Wait until this machine's node executor has registered its node (it reconciles what
    runs there first): before that, every job would be refused for want of nodes. An executor
    that exited instead is not waited for: `started` reports it."""
    credentials = load_credentials(admin_file) if admin_file is not None else None
    log = JetStreamLog(await connect(nats_url, "fairlane-up", credentials=credentials))
    try:
        deadline = time.monotonic() + within
        while await log.last_on(f"fl.node.{node}.node_registered") is None:
            if _exited(data_dir, "executor"):
                return
            if time.monotonic() > deadline:
                raise EmbeddedError(f"the node executor for {node!r} did not register in time")
            await asyncio.sleep(0.1)
    finally:
        await log.nc.close()
