"""Benchmark: jobs per second from submit to running, through the whole pipeline.

A fresh nats-server; admission, the quota ledger, the scheduler and the preemptor as their own
processes; 100 hollow node executors (the executor's full event handling, starting no process,
as Kubernetes' kubemark does) in this process on one connection; short jobs. Reported:

- end-to-end throughput: jobs running per second, first submit to last start, with
  `--clients` each sending its next job once the last was answered (a closed loop). Enough of
  them keep the pipeline busy: a client waits about 8 ms for admission's answer (two writes
  to the log, each acked), so 8 clients hold a closed loop to about 1,000 jobs/s whatever
  the services could do, and it grows with more until the machine is the limit (the curve is
  in docs/event-log.md);
- submit-to-start latency p50/p99 (submit = the client sends the command; start = the
  `JobStarted` event's time);
- raw JetStream publish throughput with the same client library in the same run (acks
  awaited one by one, and in batches of 1,000), and the pipeline's ratio to it;
- CPU milliseconds per job of each process (nats-server, each service, and this process with
  the clients and the executors) over the same window: where the machine's time goes;
- open loop, at each fixed offered load (`--rates`, jobs a second, for `--open-s` seconds
  each): submissions go out on a fixed schedule whatever the answers, so the latency is that
  of a pipeline offered this load, not of clients that saturate it (the closed loop above
  measures the most it can take, with a queue in front). Per load: the rate the sender kept,
  the throughput achieved (jobs started per second), and submit-to-start latency p50/p99.
  Each load starts on an idle cluster (the previous load's jobs have finished).

Each executor reads only its node's relayed work (`fl-work.<node>` in the relay stream, written by
the node watcher); reported: the events in the stream over the run (what each executor read when it
followed the whole stream) against the relays per node (what it reads now).

The watcher that times starts reads only `fl.job.*.job_started.*` (a filtered consumer), so
measuring adds little to what is measured.

`--baseline REV` runs the same measure twice, moments apart on the same machine: first on the
code of git revision REV (`git archive` into a temporary folder: its services, started as
processes from there, and its executors), then on this tree's; each run is a child process of
its own (bench/revision.py). Reported: both runs' figures and the ratios (`Against`).
`--profile DIR` has each service write its cProfile to `DIR/<service>.prof`.

    uv run python -m bench.pipeline [--jobs 3000] [--nodes 100] [--clients 32]
        [--gpus-per-node 16] [--rates 500,1000] [--open-s 5] [--baseline main] [--profile DIR]
        [-o json]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cyclopts
import msgspec
from nats.aio.client import Client
from rich.console import Console
from rich.table import Table

from bench.options import BadOption, Output, run_command
from bench.revision import ROOT, check_out, child_output
from cluster.servers import NatsServer
from events import JobCancelled, JobSpec, JobStarted
from events.commands import CancelJob, SetPool, SetProject, SubmitJob
from events.units import percentile
from services.executor.service import Executor, ExecutorConfig, ExecutorGroup
from services.nodewatch.service import TIMEOUT_ENV
from services.runtime.auth import Credentials
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.main import configure_logging


@dataclass
class OpenLoop:
    """Submit-to-start latency at one fixed offered load."""

    offered_per_s: float
    jobs: int
    #: the submission rate kept (below the offered one if this process fell behind)
    sent_per_s: float
    #: achieved throughput: jobs started per second, first submission to last start
    started_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float


@dataclass
class Figures:
    jobs: int
    nodes: int
    clients: int
    jobs_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    raw_publish_per_s: float
    raw_publish_batched_per_s: float
    ratio_to_raw: float
    ratio_to_raw_batched: float
    #: CPU time per job, milliseconds, by process, over the whole run (Linux /proc)
    cpu_ms_per_job: dict[str, float]
    #: the sum of `cpu_ms_per_job`: every process's CPU per job
    cpu_ms_per_job_total: float
    #: latency at fixed offered loads, one per rate
    open_loop: list[OpenLoop] = field(default_factory=list)
    #: events in the stream at the end: what each executor read when it followed it all
    stream_events: int = 0
    #: relays delivered to the executors, per node: what each reads now (its own work)
    work_events_per_node: float = 0.0


SERVICES = ("admission", "ledger", "scheduler", "preemptor", "nodewatch")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def raw_publish_rate(url: str, count: int, batched: bool) -> float:
    log = JetStreamLog(await connect(url, "raw"))
    await log.ensure_stream()
    events = [
        JobCancelled(id=f"raw-{batched}-{i}", time=0.0, actor="bench", job_id=f"raw{i}")
        for i in range(count)
    ]
    start = time.perf_counter()
    if batched:
        for i in range(0, count, 1000):
            await asyncio.gather(*(log.publish(e) for e in events[i : i + 1000]))
    else:
        for e in events:
            await log.publish(e)
    rate = count / (time.perf_counter() - start)
    await log.nc.close()
    return rate


#: How long a hollow replica runs before it finishes
HOLLOW_RUNTIME_S = 1.0
#: The most one run may submit, closed and open loop together (every input is bounded)
MAX_JOBS = 1_000_000


class Starts:
    """When each of the bench's jobs started, as the watcher reads `JobStarted` events."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self._waiting: set[str] = set()
        self._all = asyncio.Event()

    def record(self, job_id: str, at: float) -> None:
        self.at.setdefault(job_id, at)
        self._waiting.discard(job_id)
        if not self._waiting:
            self._all.set()

    async def wait_for(self, job_ids: Sequence[str], timeout_s: float) -> None:
        self._waiting = {j for j in job_ids if j not in self.at}
        if not self._waiting:
            return
        self._all.clear()
        try:
            await asyncio.wait_for(self._all.wait(), timeout_s)
        except TimeoutError:
            raise RuntimeError(
                f"only {len(job_ids) - len(self._waiting)} of {len(job_ids)} jobs started"
            ) from None


async def _submit(nc: Client, job_id: str) -> None:
    spec = JobSpec(project="bench", gpus=1)
    reply = await send(nc, SubmitJob(job_id=job_id, spec=spec, idempotency_key=job_id))
    if not reply.ok:
        raise RuntimeError(reply.error)


async def closed_loop(
    url: str,
    job_ids: list[str],
    clients: int,
    submitted: dict[str, float],
    credentials: Credentials | None = None,
) -> None:
    """Each client submits the next job as soon as the last one was answered (as the user of
    `credentials`, on a server with authentication)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for job_id in job_ids:
        queue.put_nowait(job_id)

    async def client(k: int) -> None:
        nc = await connect(url, f"client{k}", credentials=credentials)
        while not queue.empty():
            job_id = queue.get_nowait()
            submitted[job_id] = time.time()
            await _submit(nc, job_id)
        await nc.close()

    await asyncio.gather(*(client(k) for k in range(clients)))


async def open_loop(
    conns: list[Client], job_ids: list[str], rate: float, submitted: dict[str, float]
) -> None:
    """Submit the jobs `rate` a second on a fixed schedule: each submission is due at its
    time whether or not earlier ones were answered (one that falls behind goes at once)."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    sends = []
    for i, job_id in enumerate(job_ids):
        delay = begin + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        submitted[job_id] = time.time()
        sends.append(asyncio.create_task(_submit(conns[i % len(conns)], job_id)))
    await asyncio.gather(*sends)


def open_loop_figures(
    rate: float, job_ids: list[str], submitted: dict[str, float], starts: Starts
) -> OpenLoop:
    sent = [submitted[j] for j in job_ids]
    latencies = sorted((starts.at[j] - submitted[j]) * 1000 for j in job_ids)
    sending_s = max(sent) - min(sent)
    return OpenLoop(
        offered_per_s=rate,
        jobs=len(job_ids),
        sent_per_s=round((len(sent) - 1) / sending_s, 1) if sending_s > 0 else 0.0,
        started_per_s=round(len(job_ids) / (max(starts.at[j] for j in job_ids) - min(sent)), 1),
        latency_p50_ms=round(percentile(latencies, 0.50), 1),
        latency_p99_ms=round(percentile(latencies, 0.99), 1),
        latency_max_ms=round(latencies[-1], 1),
    )


async def run(  # noqa: PLR0915 (the bench's whole run: options in, figures out)
    jobs: int,
    nodes: int,
    clients: int,
    gpus_per_node: int,
    rates: Sequence[float] = (),
    open_s: float = 5.0,
    say: Callable[[str], object] = lambda _: None,
    raw_events: int = 5000,
    profile: Path | None = None,
) -> Figures:
    """The whole run; raw publishing is timed over `raw_events` events acked one by one, and
    four times as many in batches. `profile`: a folder each service writes its cProfile to."""
    profiling = {}
    if profile is not None:
        # named here only: a baseline revision's services may not know it (and then ignore it)
        from services.runtime.main import PROFILE_ENV  # noqa: PLC0415

        profiling = {PROFILE_ENV: str(profile.resolve())}
    with tempfile.TemporaryDirectory(prefix="fairlane-bench-") as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats")
        await server.start()
        services: list[asyncio.subprocess.Process] = []
        try:
            for name in SERVICES:
                services.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        f"services.{name}",
                        "--nats",
                        server.url,
                        "--log-level",
                        "warning",
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.DEVNULL,
                        # hollow nodes send no heartbeats: the node watcher must not lose them
                        env={**os.environ, TIMEOUT_ENV: "3600", **profiling},
                    )
                )
            log = JetStreamLog(await connect(server.url, "bench"))
            await log.ensure_stream()
            group_log = JetStreamLog(await connect(server.url, "hollow-executors"))
            executors = [
                Executor(
                    group_log,
                    ExecutorConfig(
                        node=f"n{i:03d}",
                        pool="default",
                        gpus=gpus_per_node,
                        hollow=True,
                        hollow_runtime_s=HOLLOW_RUNTIME_S,
                        data_dir=root / "executors" / f"n{i}",
                    ),
                )
                for i in range(nodes)
            ]
            ready = asyncio.Event()
            hollow = ExecutorGroup(group_log, executors)
            group = asyncio.create_task(hollow.run(ready))
            await asyncio.wait_for(ready.wait(), 60)
            await until_ok(log, CancelJob(job_id="readiness-probe"), answer=True)
            await until_ok(log, SetPool(pool="default"))
            await until_ok(
                log, SetProject(project="bench", pool="default", quota=nodes * gpus_per_node)
            )

            starts = Starts()

            async def watch() -> None:
                async for stored in log.follow(1, subject="fl.job.*.job_started.*"):
                    e = stored.event
                    if isinstance(e, JobStarted) and e.attempt == 1:
                        starts.record(e.job_id, e.time)

            watching = asyncio.create_task(watch())
            submitted: dict[str, float] = {}
            closed_ids = [f"b{i}" for i in range(jobs)]

            pids = {"nats-server": server.process.pid if server.process else 0}
            pids |= {name: p.pid for name, p in zip(SERVICES, services, strict=True)}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            own_before = time.process_time()
            say(f"closed loop: {jobs} jobs, {clients} clients")
            first = time.time()
            await closed_loop(server.url, closed_ids, clients, submitted)
            await starts.wait_for(closed_ids, 600)
            last = max(starts.at[j] for j in closed_ids)
            latencies = sorted((starts.at[j] - submitted[j]) * 1000 for j in closed_ids)
            jobs_per_s = jobs / (last - first)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            cpu["bench (clients, 100 hollow executors)"] = time.process_time() - own_before
            cpu_ms_per_job = {name: round(1000 * s / jobs, 3) for name, s in cpu.items()}

            conns = [await connect(server.url, f"open{k}") for k in range(clients)]
            loads: list[OpenLoop] = []
            for n, rate in enumerate(rates):
                await asyncio.sleep(HOLLOW_RUNTIME_S + 0.5)  # the last load's jobs are done
                ids = [f"o{n}-{i}" for i in range(max(2, round(rate * open_s)))]
                say(f"open loop: {len(ids)} jobs at {rate:g} a second")
                await open_loop(conns, ids, rate, submitted)
                await starts.wait_for(ids, 600)
                loads.append(open_loop_figures(rate, ids, submitted, starts))
            for nc in conns:
                await nc.close()

            stream_events = await log.last_seq()
            work_per_node = hollow.delivered / nodes
            watching.cancel()
            group.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await group
            say("raw JetStream publishing")
            raw = await raw_publish_rate(server.url, raw_events, batched=False)
            raw_batched = await raw_publish_rate(server.url, 4 * raw_events, batched=True)
            await log.nc.close()
            await group_log.nc.close()
        finally:
            for p in services:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
                await p.wait()
            await server.stop()
    return Figures(
        jobs=jobs,
        nodes=nodes,
        clients=clients,
        jobs_per_s=round(jobs_per_s, 1),
        latency_p50_ms=round(percentile(latencies, 0.50), 1),
        latency_p99_ms=round(percentile(latencies, 0.99), 1),
        raw_publish_per_s=round(raw, 1),
        raw_publish_batched_per_s=round(raw_batched, 1),
        ratio_to_raw=round(jobs_per_s / raw, 3),
        ratio_to_raw_batched=round(jobs_per_s / raw_batched, 3),
        cpu_ms_per_job=cpu_ms_per_job,
        cpu_ms_per_job_total=round(sum(cpu_ms_per_job.values()), 3),
        open_loop=loads,
        stream_events=stream_events,
        work_events_per_node=round(work_per_node, 1),
    )


@dataclass
class Against:
    """The same measure on a baseline revision's code (`before`) and this tree's (`after`)."""

    revision: str
    before: Figures
    after: Figures
    #: after over before (above 1: more jobs a second now)
    jobs_per_s_ratio: float
    #: before over after, each process and `total` (above 1: less CPU a job now)
    cpu_ratio: dict[str, float]
    #: before over after (above 1: sooner now): closed loop, then each offered load's
    latency_p50_ratio: float
    open_loop_p50_ratio: dict[str, float]


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 2) if denominator else 0.0


def paired(revision: str, before: Figures, after: Figures) -> Against:
    cpu = {k: _ratio(v, after.cpu_ms_per_job.get(k, 0.0)) for k, v in before.cpu_ms_per_job.items()}
    cpu["total"] = _ratio(before.cpu_ms_per_job_total, after.cpu_ms_per_job_total)
    loads = {
        f"{old.offered_per_s:g}": _ratio(old.latency_p50_ms, new.latency_p50_ms)
        for old, new in zip(before.open_loop, after.open_loop, strict=True)
    }
    return Against(
        revision=revision,
        before=before,
        after=after,
        jobs_per_s_ratio=_ratio(after.jobs_per_s, before.jobs_per_s),
        cpu_ratio=cpu,
        latency_p50_ratio=_ratio(before.latency_p50_ms, after.latency_p50_ms),
        open_loop_p50_ratio=loads,
    )


def against(revision: str, asked: dict[str, object], profile: Path | None = None) -> Against:
    """`run(**asked)` on the code of git `revision`, then on this tree's, each in a child
    process (bench/revision.py); `profile`: this tree's services' profiles only."""
    request = msgspec.json.encode(asked).decode()
    with tempfile.TemporaryDirectory(prefix="pipeline-baseline-") as tmp:
        check_out(revision, Path(tmp))
        before = _child_figures(Path(tmp), request, "the pipeline at " + revision)
    now = {**asked, "profile": str(profile.resolve()) if profile is not None else None}
    after = _child_figures(ROOT, msgspec.json.encode(now).decode(), "the pipeline now")
    return paired(revision, before, after)


def _child_figures(tree: Path, request: str, what: str) -> Figures:
    return msgspec.json.decode(child_output(tree, Path(__file__), request, what), type=Figures)


def child(request: str) -> None:
    """In a child of `against`: `run` as asked, its figures written as JSON."""
    asked = msgspec.json.decode(request)
    profile = asked.pop("profile", None)
    configure_logging("error")
    say = Console(stderr=True).log
    figures = asyncio.run(run(**asked, say=say, profile=None if profile is None else Path(profile)))
    sys.stdout.write(msgspec.json.encode(figures).decode() + "\n")


async def until_ok(
    log: JetStreamLog, command: SetPool | SetProject | CancelJob, answer: bool = False
) -> None:
    """Until the service answers (`answer`), or answers yes."""
    for _ in range(100):
        try:
            reply = await send(log.nc, command, wait_s=2.0)
        except Exception:  # the service is still starting
            await asyncio.sleep(0.2)
            continue
        if reply.ok or answer:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{type(command).__name__} never succeeded")


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    jobs: int = 3000,
    nodes: int = 100,
    clients: int = 32,
    gpus_per_node: int = 16,
    rates: str = "500,1000",
    open_s: float = 5.0,
    baseline: str | None = None,
    profile: Path | None = None,
    output: Output = "text",
) -> None:
    """Measure submit-to-running throughput and latency through the services.

    Parameters
    ----------
    jobs
        Jobs to submit in the closed loop (1 GPU each; hollow replicas finish after 1 s).
    nodes
        Hollow node executors.
    clients
        Concurrent submitting clients (closed loop), and connections the open loop sends on.
        Each waits for its answer before sending the next: 8 hold the closed loop to about
        1,000 jobs/s on their own; 32 keep this machine's pipeline busy.
    gpus_per_node
        GPUs each hollow node declares. 100 nodes of 16 leave room for 1,600 starts a second
        of jobs that last 1 s, above the 1,000 aimed at (100 of 8 held the rate to 800).
    rates
        Comma-separated offered loads for the open loop, jobs a second ("" for none).
    open_s
        Seconds each offered load lasts (rate x seconds jobs).
    baseline
        A git revision (e.g. main): measure on its code, then on this tree's, and give both
        with their ratios.
    profile
        A folder (made if need be) each service of this tree writes its cProfile to
        (<service>.prof).
    output
        text (tables) or json.
    """
    offered = parse_rates(rates)
    if not 0 < open_s <= 600:
        raise BadOption(f"--open-s must be above 0 and at most 600 seconds, not {open_s}")
    total = jobs + sum(round(r * open_s) for r in offered)
    if not jobs >= 1 or total > MAX_JOBS:
        raise BadOption(f"--jobs must be at least 1, and all jobs at most {MAX_JOBS:,}: {total:,}")
    if profile is not None:
        try:
            profile.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadOption(f"--profile: {str(profile)!r} cannot be a folder: {e}") from None
    configure_logging("error")
    if baseline is not None:
        asked: dict[str, object] = {"jobs": jobs, "nodes": nodes, "clients": clients}
        asked |= {"gpus_per_node": gpus_per_node, "rates": offered, "open_s": open_s}
        print_against(against(baseline, asked, profile), output)
        return
    Console(stderr=True).print(
        f"submitting {jobs} jobs to {nodes} hollow nodes, then open loop at {rates or 'none'} ..."
    )
    console = Console(stderr=True)
    figures = asyncio.run(
        run(jobs, nodes, clients, gpus_per_node, offered, open_s, console.log, profile=profile)
    )
    if output == "json":
        sys.stdout.write(msgspec.json.encode(asdict(figures)).decode() + "\n")
        return
    table = Table(title="Submit to running, through the whole pipeline (closed loop)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in asdict(figures).items():
        if isinstance(value, dict):
            for part, amount in value.items():
                table.add_row(f"{key}: {part}", f"{amount:,}")
        elif not isinstance(value, list):
            table.add_row(key, f"{value:,}")
    out = Console()
    out.print(table)
    if figures.open_loop:
        out.print(open_loop_table(figures.open_loop))


def print_against(result: Against, output: str) -> None:
    """Before and after side by side, with their ratios."""
    if output == "json":
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
        return
    table = Table(title=f"Through the whole pipeline: {result.revision} (before) and now")
    for column in ("figure", "before", "now", "ratio"):
        table.add_column(column, justify="right")
    old, new = result.before, result.after
    table.add_row(
        "jobs/s", f"{old.jobs_per_s:,}", f"{new.jobs_per_s:,}", f"{result.jobs_per_s_ratio}"
    )
    table.add_row(
        "p50 ms", f"{old.latency_p50_ms}", f"{new.latency_p50_ms}", f"{result.latency_p50_ratio}"
    )
    for name, ratio in result.cpu_ratio.items():
        before = old.cpu_ms_per_job_total if name == "total" else old.cpu_ms_per_job[name]
        now = new.cpu_ms_per_job_total if name == "total" else new.cpu_ms_per_job.get(name, 0.0)
        table.add_row(f"CPU ms/job: {name}", f"{before}", f"{now}", f"{ratio}")
    for a, b in zip(old.open_loop, new.open_loop, strict=True):
        ratio = result.open_loop_p50_ratio[f"{a.offered_per_s:g}"]
        table.add_row(
            f"open {a.offered_per_s:g}/s p50 ms",
            f"{a.latency_p50_ms}",
            f"{b.latency_p50_ms}",
            f"{ratio}",
        )
    table.add_row("stream events", f"{old.stream_events:,}", f"{new.stream_events:,}", "")
    Console().print(table)


def parse_rates(text: str) -> list[float]:
    """'200,400,800' -> [200.0, 400.0, 800.0]; each above 0 and at most 100,000 a second."""
    rates = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            raise BadOption(f"--rates: {part!r} is not a number of jobs a second") from None
        if not 0 < rate <= 100_000:
            raise BadOption(f"--rates: {part!r} must be above 0 and at most 100,000 a second")
        rates.append(rate)
    return rates


def open_loop_table(loads: list[OpenLoop]) -> Table:
    table = Table(title="Open loop: latency at fixed offered loads")
    columns = ("offered /s", "jobs", "sent /s", "started /s", "p50 ms", "p99 ms", "max ms")
    for column in columns:
        table.add_column(column, justify="right")
    for load in loads:
        table.add_row(
            f"{load.offered_per_s:g}",
            f"{load.jobs:,}",
            f"{load.sent_per_s:,.1f}",
            f"{load.started_per_s:,.1f}",
            f"{load.latency_p50_ms:,.1f}",
            f"{load.latency_p99_ms:,.1f}",
            f"{load.latency_max_ms:,.1f}",
        )
    return table


if __name__ == "__main__":
    run_command(app)
