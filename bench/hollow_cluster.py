"""Benchmark: a thousand hollow node executors against a three-server NATS JetStream cluster.

As Kubernetes' kubemark does: 1,000 hollow executors (the executor's full event handling,
starting no process; `ExecutorGroup` in this process, on one connection) against three
nats-servers in one JetStream cluster on loopback, their routes logging in with the routes'
password as deploy's `nats-cluster.conf` has them (services/runtime/auth.py, `write_auth`),
every user with its own password and permissions. The stream, the lease bucket and the
snapshot and checkpoint stores are kept on all three (`provision`, replicas 3). Admission, the
quota ledger, the scheduler, the preemptor and the node watcher run as their own processes,
each as its own NATS user, given all three servers. Clients submit short 1-GPU jobs (a closed
loop: each sends the next once the last was answered). Reported:

- jobs running per second, first submit to last start, and submit-to-start latency p50/p99
  (submit: the client sends the command; start: the `JobStarted` event's time);
- the peak resident memory (Linux's VmHWM) of each nats-server, each service, and this
  process (the clients and the hollow executors);
- CPU milliseconds per job of each process over the same window;
- the checks of the crash tests, on the whole log read back once every job completed: every
  job completed exactly once, and no GPU held by two attempts at once (the independent ledger
  of simulation/holdings.py, built from the executors' reports, not the policy's fold). The
  command exits 1 if a check fails.

    uv run python -m bench.hollow_cluster [--nodes 1000] [--jobs 3000] [--clients 8] [-o json]

The figures taken are in the README's "Figures".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Final

import cyclopts
import msgspec
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError
from rich.console import Console
from rich.table import Table

from bench.options import BadOption, Output, run_command
from bench.pipeline import SERVICES, Starts, closed_loop, cpu_seconds, until_ok
from bench.rss import peak_mib
from cluster.provision import provision
from cluster.servers import NatsServer, free_ports
from events import JobCompleted, JobStarted
from events.commands import CancelJob, SetPool, SetProject
from events.units import percentile
from services.executor.service import Executor, ExecutorConfig, ExecutorGroup
from services.nodewatch.service import TIMEOUT_ENV
from services.runtime.auth import (
    ADMIN,
    CLIENT,
    CREDENTIALS_ENV,
    Cluster,
    load_credentials,
    write_auth,
)
from services.runtime.eventlog import STREAM, JetStreamLog, Stored, connect
from services.runtime.main import configure_logging
from simulation.holdings import check_holdings

#: nats-servers in the cluster, and the copies kept of the stream and buckets
SERVERS: Final = 3
#: The most one run may submit, and the most nodes (every input is bounded)
MAX_JOBS: Final = 1_000_000
MAX_NODES: Final = 10_000
#: How long a run may wait for its jobs to start, and then to complete
WAIT_S: Final = 600.0
GPUS_PER_NODE: Final = 8


@dataclass
class Checks:
    """What the crash tests check, on the whole log of the run."""

    jobs: int
    #: jobs with exactly one `JobCompleted`
    completed_once: int
    #: jobs with none, or with more than one (at most ten named)
    not_once: list[str] = field(default_factory=list)
    #: the independent ledger's problems: a GPU held by two attempts at once, an attempt
    #: started twice
    gpu_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.completed_once == self.jobs and not self.gpu_problems


@dataclass
class Figures:
    nodes: int
    jobs: int
    clients: int
    servers: int
    #: the copies the stream is kept in, as the cluster reports it at the end
    replicas: int
    jobs_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    #: peak resident memory, MiB, by process (Linux /proc; None elsewhere)
    peak_rss_mib: dict[str, float | None]
    #: CPU time per job, milliseconds, by process, over the closed loop
    cpu_ms_per_job: dict[str, float]
    stream_events: int
    checks: Checks
    #: seconds from nothing to the executors registered and the services answering
    setup_s: float


def check(job_ids: list[str], stored: list[Stored]) -> Checks:
    """Every job completed exactly once, and no GPU was held by two attempts at once."""
    holdings = check_holdings(stored)
    once = [j for j in job_ids if holdings.completed.get(j, 0) == 1]
    not_once = sorted(set(job_ids) - set(once))
    named = [f"{j}: completed {holdings.completed.get(j, 0)} times" for j in not_once[:10]]
    return Checks(len(job_ids), len(once), named, holdings.problems)


async def start_servers(root: Path) -> list[NatsServer]:
    """Three nats-servers in one cluster, routes logging in, every Fairlane user configured."""
    ports = free_ports(2 * SERVERS)  # at once: asked apart, two could be the same
    routes = [f"127.0.0.1:{port}" for port in ports[:SERVERS]]
    servers = []
    for i, route in enumerate(routes):
        config = root / f"nats-{i + 1}.conf"
        write_auth(root, config, [], cluster=Cluster("fairlane-bench", route, routes))
        servers.append(
            NatsServer(
                root / f"nats-{i + 1}", port=ports[SERVERS + i], config=config, name=f"nats-{i + 1}"
            )
        )
    await asyncio.gather(*(s.start() for s in servers))
    return servers


async def provision_replicated(log: JetStreamLog, within_s: float = 60.0) -> None:
    """The stream and buckets, kept on every server, once the cluster has elected its
    JetStream leader. Until then the API answers that it is unavailable, or not at all: asked
    with a short timeout (nats-py's own is 5 s, and the leader comes within a second)."""
    deadline = time.monotonic() + within_s
    asking = log.nc.jetstream(timeout=0.25)
    while True:
        try:
            await asking.account_info()
            await provision(log.js, replicas=SERVERS)
            return
        except (APIError, NoStreamResponseError, ServiceUnavailableError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def start_services(
    root: Path, url: str, env: dict[str, str]
) -> dict[str, asyncio.subprocess.Process]:
    processes = {}
    for name in SERVICES:
        with (root / f"{name}.log").open("wb") as errors:
            processes[name] = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", f"services.{name}", "--nats", url),
                *("--log-level", "warning"),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=errors,
                env={**env, CREDENTIALS_ENV: str(root / "credentials" / f"{name}.json")},
            )
    return processes


def hollow_group(log: JetStreamLog, root: Path, nodes: int, runtime_s: float) -> ExecutorGroup:
    """`nodes` hollow executors on one connection (`ExecutorConfig(hollow=True)`: replicas
    that start nothing and complete after `runtime_s`)."""
    return ExecutorGroup(
        log,
        [
            Executor(
                log,
                ExecutorConfig(
                    node=f"n{i:04d}",
                    pool="default",
                    gpus=GPUS_PER_NODE,
                    hollow=True,
                    hollow_runtime_s=runtime_s,
                    data_dir=root / "executors" / f"n{i:04d}",
                ),
            )
            for i in range(nodes)
        ],
    )


class Completions:
    """The bench's jobs completed so far, as `JobCompleted` events are read."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.changed = asyncio.Event()

    async def follow(self, log: JetStreamLog) -> None:
        async for stored in log.follow(1, subject="fl.job.*.job_completed.*"):
            if isinstance(stored.event, JobCompleted):
                self.done.add(stored.event.job_id)
                self.changed.set()

    async def wait_for(self, job_ids: list[str], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while not self.done.issuperset(job_ids):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                missing = len(set(job_ids) - self.done)
                raise RuntimeError(f"{missing} of {len(job_ids)} jobs never completed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


async def run(  # noqa: PLR0915 (the bench's whole run: options in, figures out)
    nodes: int,
    jobs: int,
    clients: int,
    runtime_s: float = 1.0,
    say: Callable[[str], object] = lambda _: None,
) -> Figures:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fairlane-hollow-") as tmp:
        root = Path(tmp)
        say(f"starting {SERVERS} nats-servers in one cluster")
        servers = await start_servers(root)
        url = ",".join(s.url for s in servers)
        processes: dict[str, asyncio.subprocess.Process] = {}
        tasks: list[asyncio.Task[None]] = []
        try:
            admin = load_credentials(root / "credentials" / f"{ADMIN}.json")
            log = JetStreamLog(await connect(url, "bench", credentials=admin))
            say(f"provisioning the stream and buckets, replicated {SERVERS}")
            await provision_replicated(log)
            say("starting the services")
            # hollow nodes send no heartbeats: the node watcher must not declare them lost
            processes = await start_services(root, url, {**os.environ, TIMEOUT_ENV: "3600"})
            say(f"starting {nodes} hollow executors")
            group_log = JetStreamLog(await connect(url, "hollow-executors", credentials=admin))
            group = hollow_group(group_log, root, nodes, runtime_s)
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(group.run(ready)))
            await asyncio.wait_for(ready.wait(), 120)
            await until_ok(log, CancelJob(job_id="readiness-probe"), answer=True)
            await until_ok(log, SetPool(pool="default"))
            quota = nodes * GPUS_PER_NODE
            await until_ok(log, SetProject(project="bench", pool="default", quota=quota))
            setup_s = time.monotonic() - began

            starts, completions = Starts(), Completions()
            tasks.append(asyncio.create_task(_watch_starts(log, starts)))
            tasks.append(asyncio.create_task(completions.follow(log)))
            pids = {s.name or "": s.process.pid for s in servers if s.process is not None}
            pids |= {name: p.pid for name, p in processes.items()}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            own_before = time.process_time()
            say(f"submitting {jobs} jobs from {clients} clients")
            ids = [f"h{i}" for i in range(jobs)]
            submitted: dict[str, float] = {}
            client = load_credentials(root / "credentials" / f"{CLIENT}.json")
            first = time.time()
            await closed_loop(url, ids, clients, submitted, credentials=client)
            await starts.wait_for(ids, WAIT_S)
            last = max(starts.at[j] for j in ids)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            cpu[f"bench ({nodes} hollow executors, clients)"] = time.process_time() - own_before
            say("waiting for every job to complete, then reading the log back")
            await completions.wait_for(ids, WAIT_S)
            stored = [s async for s in log.read(1)]
            replicas = (await log.js.stream_info(STREAM)).config.num_replicas or 1
            peaks = {name: peak_mib(pid) for name, pid in pids.items()}
            peaks[f"bench ({nodes} hollow executors, clients)"] = peak_mib()
            latencies = sorted((starts.at[j] - submitted[j]) * 1000 for j in ids)
            group.stop()
            await log.nc.close()
            await group_log.nc.close()
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            for p in processes.values():
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
                await p.wait()
            await asyncio.gather(*(s.stop() for s in servers))
    return Figures(
        nodes=nodes,
        jobs=jobs,
        clients=clients,
        servers=SERVERS,
        replicas=replicas,
        jobs_per_s=round(jobs / (last - first), 1),
        latency_p50_ms=round(percentile(latencies, 0.50), 1),
        latency_p99_ms=round(percentile(latencies, 0.99), 1),
        peak_rss_mib=peaks,
        cpu_ms_per_job={name: round(1000 * s / jobs, 3) for name, s in cpu.items()},
        stream_events=len(stored),
        checks=check(ids, stored),
        setup_s=round(setup_s, 1),
    )


async def _watch_starts(log: JetStreamLog, starts: Starts) -> None:
    async for stored in log.follow(1, subject="fl.job.*.job_started.*"):
        e = stored.event
        if isinstance(e, JobStarted) and e.attempt == 1:
            starts.record(e.job_id, e.time)


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    nodes: int = 1000,
    jobs: int = 3000,
    clients: int = 8,
    runtime_s: Annotated[float, cyclopts.Parameter(name="--runtime")] = 1.0,
    output: Output = "text",
) -> None:
    """Submit short jobs to hollow executors through a replicated three-server cluster.

    Parameters
    ----------
    nodes
        Hollow node executors (8 GPUs each), in this process on one connection.
    jobs
        Jobs to submit (1 GPU each).
    clients
        Concurrent submitting clients (closed loop).
    runtime_s
        Seconds a hollow replica runs before it completes.
    output
        text (tables) or json.
    """
    validate(nodes, jobs, clients, runtime_s)
    configure_logging("error")
    console = Console(stderr=True)
    figures = asyncio.run(run(nodes, jobs, clients, runtime_s, console.log))
    if output == "json":
        doc = asdict(figures)
        doc["checks"]["ok"] = figures.checks.ok
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
    else:
        Console().print(table(figures))
    if not figures.checks.ok:
        raise SystemExit(1)


def validate(nodes: int, jobs: int, clients: int, runtime_s: float) -> None:
    """A clear error naming the flag and the value, for anything out of bounds."""
    if not 1 <= nodes <= MAX_NODES:
        raise BadOption(f"--nodes must be from 1 to {MAX_NODES:,}, not {nodes}")
    if not 1 <= jobs <= MAX_JOBS:
        raise BadOption(f"--jobs must be from 1 to {MAX_JOBS:,}, not {jobs}")
    if not 1 <= clients <= jobs:
        raise BadOption(f"--clients must be from 1 to --jobs ({jobs}), not {clients}")
    if not 0 < runtime_s <= 3600:
        raise BadOption(f"--runtime must be above 0 and at most 3600 seconds, not {runtime_s}")


def table(figures: Figures) -> Table:
    title = (
        f"{figures.nodes:,} hollow executors, {figures.servers} nats-servers "
        f"(replicas {figures.replicas}), {figures.jobs:,} jobs"
    )
    out = Table(title=title)
    out.add_column("figure")
    out.add_column("value", justify="right")
    for key in ("jobs_per_s", "latency_p50_ms", "latency_p99_ms", "stream_events", "setup_s"):
        out.add_row(key, f"{getattr(figures, key):,}")
    for name, mib in figures.peak_rss_mib.items():
        out.add_row(f"peak RSS MiB: {name}", "-" if mib is None else f"{mib:,.1f}")
    for name, ms in figures.cpu_ms_per_job.items():
        out.add_row(f"CPU ms per job: {name}", f"{ms:,.3f}")
    c = figures.checks
    out.add_row("check: completed exactly once", f"{c.completed_once:,} of {c.jobs:,}")
    out.add_row("check: GPU held by two attempts at once", str(len(c.gpu_problems)))
    for problem in [*c.not_once, *c.gpu_problems[:10]]:
        out.add_row("check failed", problem)
    return out


if __name__ == "__main__":
    run_command(app)
