"""Keeping the embedded cluster running: restart what exits, with backoff.

`fairlane up` writes a plan (what to run, with which arguments and environment) and starts
`python -m cluster.supervisor --plan PLAN` in the background. The plan holds the servers
(nats-server, and PostgreSQL through its keeper `python -m cluster.servers
postgres`) as well as the services, so a server killed -9 comes back like any service, with
its data folder and on its port. The supervisor starts every program, and when one exits
it logs why (exit status, how long it ran) and starts it again after a pause that doubles
from RESTART_FIRST_S up to RESTART_MAX_S (and is forgotten once a run lasted STABLE_S).
A program that exits within STARTUP_S of its start *failed to start*. What every program
is doing is written to a status file after each change, which `fairlane up` reads to report
a service that failed to start and `fairlane status` shows. The supervisor also checks the
event log's limits every LIMITS_EVERY_S and records a warning from 80% full
(cluster/provision.py).

SIGTERM stops it in three steps: first the programs marked `stop_first` (the node executors,
which stop their workloads as a preemption does and report it while the log and the services
still run), each SIGKILLed after its own `stop_grace_s`; then the others; then the servers
(`stop_last`), which the others stand on. SIGHUP makes it read the plan again: it starts the
programs the plan gained and stops (as SIGTERM does, each with its own grace) those it lost,
leaving the others running; `fairlane up` adds the services so once the servers take
connections, and `fairlane node start` and `node stop` add and remove a node's executor so
(cluster/nodes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Final, Literal

import msgspec
import structlog

from cluster.provision import check_limits
from services.runtime.auth import load_credentials
from services.runtime.connection import connect
from services.runtime.main import configure_logging

RESTART_FIRST_S: Final = 0.5
RESTART_MAX_S: Final = 30.0
STABLE_S: Final = 60.0
STARTUP_S: Final = 3.0
STOP_GRACE_S: Final = 10.0
LIMITS_EVERY_S: Final = 60.0
#: How often nats-server's log is read for a write that failed (a full disk).
STORE_EVERY_S: Final = 1.0
#: Free space on the JetStream store's disk from which a nats-server that failed a write is
#: restarted: after a failed write it refuses every later write to that stream, even once
#: space returns, until it is restarted (it reads the stream back from its files then).
STORE_FREE_BYTES: Final = 8 << 20
#: What nats-server logs when a stream's file store failed a write.
WRITE_FAILED: Final = ("critical write error", "no space left on device")
NATS_SERVER: Final = "nats-server"
log = structlog.get_logger("cluster.supervisor")

State = Literal["starting", "running", "restarting", "stopped"]


class Program(msgspec.Struct, frozen=True):
    name: str
    args: list[str]  # after the Python interpreter: ["-m", "services.ledger", ...]
    env: dict[str, str] = {}
    #: Stopped before the others, which it needs while it stops (a node executor reports its
    #: workloads stopped through the log).
    stop_first: bool = False
    #: How long it may take to exit after SIGTERM before it is killed.
    stop_grace_s: float = STOP_GRACE_S
    #: run this binary with `args` instead of the Python interpreter (nats-server)
    executable: str | None = None
    #: a server the others stand on (nats-server, PostgreSQL): stopped after every other
    #: program, so that those can still write their last events and close cleanly
    stop_last: bool = False


class Plan(msgspec.Struct, frozen=True):
    programs: list[Program]
    log_dir: str
    status_file: str
    #: where to check the event log's limits from (the admin's credentials), if anywhere
    nats_url: str | None = None
    admin_credentials: str | None = None
    #: the JetStream store folder of the program named NATS_SERVER, if it runs one: a write
    #: that failed there for want of space has it restarted once space returns
    jetstream_store: str | None = None


class ProgramStatus(msgspec.Struct):
    name: str
    state: State = "starting"
    pid: int | None = None
    started_at: float = 0.0
    restarts: int = 0
    #: how its last run ended: exit status (negative: killed by that signal) and whether it
    #: ended within STARTUP_S of its start (cleared once a run outlives STARTUP_S)
    last_exit: int | None = None
    exited_at: float | None = None
    failed_to_start: bool = False
    next_start_at: float | None = None


class SupervisorStatus(msgspec.Struct):
    pid: int
    programs: dict[str, ProgramStatus]
    warnings: list[str] = []
    updated_at: float = 0.0


def stop_within(plan: Plan) -> float:
    """The longest the supervisor takes to stop everything after SIGTERM (a margin aside)."""
    first = max((p.stop_grace_s for p in plan.programs if p.stop_first), default=0.0)
    rest = max(
        (p.stop_grace_s for p in plan.programs if not (p.stop_first or p.stop_last)), default=0.0
    )
    last = max((p.stop_grace_s for p in plan.programs if p.stop_last), default=0.0)
    return first + rest + last


def read_status(path: Path) -> SupervisorStatus | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=SupervisorStatus)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def read_plan(path: Path) -> Plan:
    return msgspec.json.decode(path.read_bytes(), type=Plan)


class Supervisor:
    def __init__(self, plan: Plan, plan_file: Path | None = None) -> None:
        self.plan = plan
        #: where SIGHUP reads the plan again from (None: the plan never changes)
        self.plan_file = plan_file
        self.status = SupervisorStatus(
            pid=os.getpid(), programs={p.name: ProgramStatus(p.name) for p in plan.programs}
        )
        self.stopping = asyncio.Event()
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.keepers: dict[str, asyncio.Task[None]] = {}
        #: programs being stopped because the plan dropped them: not to be started again
        self.retired: set[str] = set()
        self._reloading = asyncio.Lock()
        self._reloads: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        self._save()
        for program in self.plan.programs:
            self.keepers[program.name] = asyncio.create_task(self._keep(program))
        watching = asyncio.create_task(self._watch_limits())
        store = asyncio.create_task(self._watch_store())
        await self.stopping.wait()
        async with self._reloading:  # a reload half done would start what is being stopped
            await self._stop_all()
        keepers = list(self.keepers.values())
        for task in [*keepers, watching, store, *self._reloads]:
            task.cancel()
        await asyncio.gather(*keepers, watching, store, *self._reloads, return_exceptions=True)
        for status in self.status.programs.values():
            status.state, status.pid = "stopped", None
        self._save()

    def request_reload(self) -> None:
        """SIGHUP: read the plan file again, in a task (a signal handler cannot wait)."""
        task = asyncio.create_task(self._reload_from_file())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload_from_file(self) -> None:
        if self.plan_file is None:
            return
        try:
            plan = read_plan(self.plan_file)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
            log.error("could not read the plan again: kept the one running", error=str(e))
            return
        await self.reload(plan)

    async def reload(self, plan: Plan) -> None:
        """Take a changed plan: start the programs it adds, stop those it drops (SIGTERM, then
        SIGKILL after their own grace), and leave the rest running as they are."""
        async with self._reloading:
            if self.stopping.is_set():
                return
            wanted = {p.name: p for p in plan.programs}
            before = {p.name: p for p in self.plan.programs}
            dropped = [name for name in self.keepers if name not in wanted]
            added = [p for name, p in wanted.items() if name not in self.keepers]
            self.plan = plan
            for name in dropped:
                program = before.get(name)
                await self._retire(name, program.stop_grace_s if program else STOP_GRACE_S)
            for program in added:
                self.status.programs[program.name] = ProgramStatus(program.name)
                self.keepers[program.name] = asyncio.create_task(self._keep(program))
            self._save()
            log.info("plan read again", started=[p.name for p in added], stopped=dropped)

    async def _retire(self, name: str, grace: float) -> None:
        self.retired.add(name)
        keeper = self.keepers.pop(name)
        process = self.processes.pop(name, None)
        if process is not None and process.returncode is None:
            await self._terminate([process], grace)
        keeper.cancel()  # waiting to restart it, or about to note its exit: either way, done
        await asyncio.gather(keeper, return_exceptions=True)
        self.retired.discard(name)
        self.status.programs.pop(name, None)
        log.info("stopped: no longer in the plan", program=name)

    async def _keep(self, program: Program) -> None:
        status = self.status.programs[program.name]
        pause = RESTART_FIRST_S
        while not self.stopping.is_set():
            process = await self._spawn(program)
            self.processes[program.name] = process
            if program.name in self.retired:  # dropped from the plan while it was starting
                await self._terminate([process])
                return
            status.state, status.pid, status.started_at = "running", process.pid, time.time()
            status.next_start_at = None
            self._save()
            log.info("started", program=program.name, pid=process.pid, restarts=status.restarts)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STARTUP_S):
                    await process.wait()
            if process.returncode is None and status.failed_to_start:
                status.failed_to_start = False  # this time it started
                self._save()
            code = await process.wait()
            if self.stopping.is_set() or program.name in self.retired:
                return
            ran_s = time.time() - status.started_at
            if ran_s >= STABLE_S:
                pause = RESTART_FIRST_S
            status.state, status.pid, status.last_exit = "restarting", None, code
            status.exited_at = time.time()
            status.failed_to_start = ran_s < STARTUP_S
            status.restarts += 1
            status.next_start_at = time.time() + pause
            self._save()
            log.warning(
                "failed to start, restarting" if status.failed_to_start else "exited, restarting",
                program=program.name,
                exit=code,
                ran_s=round(ran_s, 1),
                restart_in_s=pause,
                log=str(Path(self.plan.log_dir) / f"{program.name}.log"),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self.stopping.wait()
            pause = min(pause * 2, RESTART_MAX_S)

    async def _spawn(self, program: Program) -> asyncio.subprocess.Process:
        path = Path(self.plan.log_dir) / f"{program.name}.log"
        with path.open("ab") as out:
            return await asyncio.create_subprocess_exec(
                program.executable or sys.executable,
                *program.args,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **program.env},
            )

    async def _stop_all(self) -> None:
        await self._stop([p for p in self.plan.programs if p.stop_first])
        await self._stop([p for p in self.plan.programs if not (p.stop_first or p.stop_last)])
        await self._stop([p for p in self.plan.programs if p.stop_last])

    async def _stop(self, programs: list[Program]) -> None:
        """SIGTERM to these programs, SIGKILL to those still running after their grace."""
        grace = max((p.stop_grace_s for p in programs), default=0.0)
        named = [self.processes.get(p.name) for p in programs]
        await self._terminate([p for p in named if p is not None], grace)

    async def _terminate(
        self, processes: list[asyncio.subprocess.Process], grace: float = STOP_GRACE_S
    ) -> None:
        """SIGTERM, and SIGKILL after `grace`, to those still running."""
        running = [p for p in processes if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(p.wait()) for p in running]
        if waits:
            await asyncio.wait(waits, timeout=grace)
        for process in running:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    async def _watch_limits(self) -> None:
        if self.plan.nats_url is None or self.plan.admin_credentials is None:
            return
        creds = load_credentials(Path(self.plan.admin_credentials))
        nc = await connect(self.plan.nats_url, "supervisor", credentials=creds)
        try:
            while True:
                try:
                    self.status.warnings = await check_limits(nc.jetstream())
                    self._save()
                except Exception as e:  # the server is away: next time
                    log.warning("could not check the event log's limits", error=repr(e))
                await asyncio.sleep(LIMITS_EVERY_S)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _watch_store(self) -> None:
        """Restart nats-server once the disk has room again after it failed a write there."""
        store = self.plan.jetstream_store
        if store is None:
            return
        path = Path(self.plan.log_dir) / f"{NATS_SERVER}.log"
        offset = path.stat().st_size if path.exists() else 0  # what it logs from now on
        failed = False
        while True:
            await asyncio.sleep(STORE_EVERY_S)
            offset, lines = _read_on(path, offset)
            if any(w in line.lower() for line in lines for w in WRITE_FAILED):
                failed = True
            if not failed or shutil.disk_usage(store).free < STORE_FREE_BYTES:
                continue
            failed = False
            process = self.processes.get(NATS_SERVER)
            if process is None or process.returncode is not None:
                continue  # it exited anyway: it is being started again
            log.warning(
                "nats-server failed a write for want of disk space and space is back: "
                "restarting it (until then it refuses every write to that stream)",
                store=store,
                free=shutil.disk_usage(store).free,
            )
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)  # its keeper starts it again

    def _save(self) -> None:
        self.status.updated_at = time.time()
        path = Path(self.plan.status_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(self.status))
        tmp.replace(path)


def _read_on(path: Path, offset: int) -> tuple[int, list[str]]:
    """The lines written to `path` after `offset`, and the offset after them (from the start
    of a file that was cut shorter)."""
    try:
        with path.open("rb") as f:
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, []
    return offset + len(data), data.decode(errors="replace").splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.supervisor")
    parser.add_argument("--plan", required=True, type=Path)
    args = parser.parse_args()
    configure_logging()
    plan = read_plan(args.plan)

    async def go() -> None:
        supervisor = Supervisor(plan, args.plan)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, supervisor.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, supervisor.request_reload)
        await supervisor.run()

    asyncio.run(go())


if __name__ == "__main__":
    main()
