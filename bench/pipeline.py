"""Benchmark: jobs per second from submit to running, through the whole pipeline.

A fresh nats-server; admission, the quota ledger, the scheduler and the preemptor as their own
processes; 100 hollow node executors (the executor's full event handling, starting no process,
as Kubernetes' kubemark does) in this process on one connection; short jobs. Reported:

- end-to-end throughput: jobs running per second, first submit to last start;
- submit-to-start latency p50/p99 (submit = the client sends the command; start = the
  `JobStarted` event's time);
- raw JetStream publish throughput with the same client library in the same run (acks
  awaited one by one, and in batches of 1,000), and the pipeline's ratio to it;
- CPU milliseconds per job of each process (nats-server, each service, and this process with
  the clients and the executors) over the same window: where the machine's time goes.

The watcher that times starts reads only `fl.job.*.job_started` (a filtered consumer), so
measuring adds little to what is measured.

    uv run python -m bench.pipeline [--jobs 3000] [--nodes 100] [--clients 8] [-o json]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
import msgspec
from rich.console import Console
from rich.table import Table

from events import JobCancelled, JobSpec, JobStarted
from events.commands import CancelJob, SetPool, SetProject, SubmitJob
from events.units import percentile
from services.executor.service import Executor, ExecutorConfig, ExecutorGroup
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.main import configure_logging
from services.runtime.servers import NatsServer


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


SERVICES = ("admission", "ledger", "scheduler", "preemptor")


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


async def run(jobs: int, nodes: int, clients: int, gpus_per_node: int) -> Figures:
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
                        hollow_runtime_s=1.0,
                        data_dir=root / "executors" / f"n{i}",
                    ),
                )
                for i in range(nodes)
            ]
            ready = asyncio.Event()
            group = asyncio.create_task(ExecutorGroup(group_log, executors).run(ready))
            await asyncio.wait_for(ready.wait(), 60)
            await _until_ok(log, CancelJob(job_id="readiness-probe"), answer=True)
            await _until_ok(log, SetPool(pool="default"))
            await _until_ok(
                log, SetProject(project="bench", pool="default", quota=nodes * gpus_per_node)
            )

            started: dict[str, float] = {}
            done = asyncio.Event()

            async def watch() -> None:
                async for stored in log.follow(1, subject="fl.job.*.job_started"):
                    e = stored.event
                    if isinstance(e, JobStarted) and e.attempt == 1 and e.job_id.startswith("b"):
                        started[e.job_id] = e.time
                        if len(started) >= jobs:
                            done.set()
                            return

            watching = asyncio.create_task(watch())
            submitted: dict[str, float] = {}
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(jobs):
                queue.put_nowait(i)

            async def client(k: int) -> None:
                nc = await connect(server.url, f"client{k}")
                while not queue.empty():
                    i = queue.get_nowait()
                    job_id = f"b{i}"
                    submitted[job_id] = time.time()
                    spec = JobSpec(project="bench", gpus=1)
                    reply = await send(
                        nc, SubmitJob(job_id=job_id, spec=spec, idempotency_key=job_id)
                    )
                    if not reply.ok:
                        raise RuntimeError(reply.error)
                await nc.close()

            pids = {"nats-server": server.process.pid if server.process else 0}
            pids |= {name: p.pid for name, p in zip(SERVICES, services, strict=True)}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            own_before = time.process_time()
            first = time.time()
            await asyncio.gather(*(client(k) for k in range(clients)))
            try:
                await asyncio.wait_for(done.wait(), 600)
            except TimeoutError:
                raise RuntimeError(
                    f"only {len(started)} of {jobs} jobs started ({len(submitted)} submitted)"
                ) from None
            last = max(started.values())
            latencies = sorted((started[j] - submitted[j]) * 1000 for j in started)
            watching.cancel()
            group.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await group
            jobs_per_s = jobs / (last - first)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            cpu["bench (clients, 100 hollow executors)"] = time.process_time() - own_before
            cpu_ms_per_job = {name: round(1000 * s / jobs, 3) for name, s in cpu.items()}
            raw = await raw_publish_rate(server.url, 5000, batched=False)
            raw_batched = await raw_publish_rate(server.url, 20000, batched=True)
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
    )


async def _until_ok(
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
    clients: int = 8,
    gpus_per_node: int = 8,
    output: Annotated[
        Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])
    ] = "text",
) -> None:
    """Measure submit-to-running throughput and latency through the services.

    Parameters
    ----------
    jobs
        Jobs to submit (1 GPU each; hollow replicas finish after 1 s).
    nodes
        Hollow node executors.
    clients
        Concurrent submitting clients.
    gpus_per_node
        GPUs each hollow node declares.
    output
        text (a table) or json.
    """
    configure_logging("error")
    Console(stderr=True).print(f"submitting {jobs} jobs to {nodes} hollow nodes ...")
    figures = asyncio.run(run(jobs, nodes, clients, gpus_per_node))
    if output == "json":
        sys.stdout.write(msgspec.json.encode(asdict(figures)).decode() + "\n")
        return
    table = Table(title="Submit to running, through the whole pipeline")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in asdict(figures).items():
        if isinstance(value, dict):
            for part, amount in value.items():
                table.add_row(f"{key}: {part}", f"{amount:,}")
        else:
            table.add_row(key, f"{value:,}")
    Console().print(table)


if __name__ == "__main__":
    app()
