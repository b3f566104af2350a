"""Benchmark: how fast a service rebuilds its state by replaying the log.

Writes a log of N events (default 1,000,000: jobs submitted, admitted, scheduled, started and
completed on a 1,000-node cluster; each with its `Nats-Msg-Id` header, as the services write
them) into a fresh nats-server, then times what a service does on start:

- without a snapshot: read every event back with the event log's consumer, decode it and fold
  it into a `ClusterState` (events per second, split into reading+decoding and folding);
- with a snapshot taken `--tail` events before the end (as the ledger takes them): load it from
  the object store and replay only the tail. The effective rate is the log's length over that
  restart time.

    uv run python -m bench.replay [--events 1000000] [--tail 50000] [-o json]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import cyclopts
import msgspec
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.options import Output, run_command
from cluster.servers import NatsServer
from events import (
    Event,
    JobAdmitted,
    JobCompleted,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    ProjectConfigured,
    ProjectTerms,
    Replica,
    encode_event,
    subject_for,
)
from policy.snapshot import encode_snapshot
from policy.state import ClusterState
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.follower import Follower
from services.runtime.main import configure_logging
from services.runtime.snapshots import SnapshotStore

NODES = 1000


@dataclass
class Figures:
    events: int
    write_s: float
    replay_s: float
    events_per_s: float
    read_decode_per_s: float
    fold_per_s: float
    live_jobs_after: int
    snapshot_bytes: int
    snapshot_save_s: float
    restart_with_snapshot_s: float
    snapshot_load_s: float
    tail_events: int
    effective_events_per_s: float


def workload(total: int) -> list[Event]:
    events: list[Event] = [
        NodeRegistered(id=f"n{i}", time=0.0, actor="b", node=f"n{i}", pool="default", gpus=8)
        for i in range(NODES)
    ]
    events.append(
        ProjectConfigured(
            id="p", time=0.0, actor="b", project="p", terms={"default": ProjectTerms(quota=8000)}
        )
    )
    i = 0
    while len(events) < total:
        job, node, t = f"j{i}", f"n{i % NODES}", float(i)
        gpu = (i // NODES) % 8
        events += [
            JobSubmitted(id=f"{job}/s", time=t, actor="b", job_id=job, spec=JobSpec(project="p")),
            JobAdmitted(
                id=f"{job}/a",
                time=t,
                actor="b",
                job_id=job,
                project="p",
                priority=50,
                preemptible=True,
                gpus=1,
                replicas=1,
                min_replicas=1,
                pools=("default",),
            ),
            JobScheduled(
                id=f"{job}/1/s",
                time=t,
                actor="b",
                job_id=job,
                attempt=1,
                pool="default",
                replicas=(Replica(node, (gpu,)),),
            ),
            JobStarted(id=f"{job}/1/st", time=t, actor="b", job_id=job, attempt=1),
            JobCompleted(id=f"{job}/1/c", time=t, actor="b", job_id=job, attempt=1),
        ]
        i += 1
    return events[:total]


async def run(total: int, tail: int, console: Console) -> Figures:
    with tempfile.TemporaryDirectory(prefix="fairlane-replay-") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats")
        await server.start()
        try:
            log = JetStreamLog(await connect(server.url, "bench"))
            await log.ensure_stream()
            events = workload(total)
            start = time.perf_counter()
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("writing the log", total=total)
                # plain publishes, the stream stores them; one flush per chunk keeps it honest
                for i in range(0, total, 10_000):
                    for event in events[i : i + 10_000]:
                        await log.nc.publish(
                            subject_for(event),
                            encode_event(event),
                            headers={"Nats-Msg-Id": event.id},
                        )
                    await log.nc.flush(timeout=60)
                    progress.update(task, completed=min(total, i + 10_000))
            while await log.last_seq() < total:  # noqa: ASYNC110  (the server's count, polled)
                await asyncio.sleep(0.1)
            write_s = time.perf_counter() - start
            del events

            with console.status("replaying the whole log"):
                start = time.perf_counter()
                decoded = [s async for s in log.read(1)]
                read_s = time.perf_counter() - start
                state = ClusterState()
                start = time.perf_counter()
                for stored in decoded:
                    state.apply(stored.event)
                fold_s = time.perf_counter() - start

            # the snapshot the ledger would have taken `tail` events before the end
            cut = max(0, len(decoded) - tail)
            at_cut = ClusterState()
            for stored in decoded[:cut]:
                at_cut.apply(stored.event)
            live_after, count = len(state.live), len(decoded)
            del decoded, state
            data = encode_snapshot(at_cut, cut)
            start = time.perf_counter()
            await SnapshotStore(log.js).save(data, cut)
            save_s = time.perf_counter() - start
            del at_cut

            with console.status("restarting from the snapshot"):
                start = time.perf_counter()
                await SnapshotStore(log.js).load()  # the load alone, for its share of a restart
                load_s = time.perf_counter() - start
                # a restart as the services make it: the newest snapshot, then the tail
                start = time.perf_counter()
                follower = Follower(log, snapshots=SnapshotStore(log.js))
                replayed = await follower.catch_up()
                restart_s = time.perf_counter() - start
            assert follower.restored_from == cut and follower.applied_seq == count
            await log.nc.close()
        finally:
            await server.stop()
    replay_s = read_s + fold_s
    return Figures(
        events=count,
        write_s=round(write_s, 2),
        replay_s=round(replay_s, 2),
        events_per_s=round(count / replay_s),
        read_decode_per_s=round(count / read_s),
        fold_per_s=round(count / fold_s),
        live_jobs_after=live_after,
        snapshot_bytes=len(data),
        snapshot_save_s=round(save_s, 2),
        restart_with_snapshot_s=round(restart_s, 2),
        snapshot_load_s=round(load_s, 2),
        tail_events=replayed,
        effective_events_per_s=round(count / restart_s),
    )


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    events: int = 1_000_000,
    tail: int = 50_000,
    output: Output = "text",
) -> None:
    """Replay a log of EVENTS events into a service's state and report events per second.

    Parameters
    ----------
    events
        Size of the log.
    tail
        Events after the snapshot, replayed on restart (the ledger snapshots every 50,000).
    output
        text (a table) or json.
    """
    configure_logging("error")
    figures = asyncio.run(run(events, tail, Console(stderr=True)))
    if output == "json":
        sys.stdout.write(msgspec.json.encode(asdict(figures)).decode() + "\n")
        return
    table = Table(title="Rebuilding a service's state from the log")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in asdict(figures).items():
        table.add_row(key, f"{value:,}")
    Console().print(table)


if __name__ == "__main__":
    run_command(app)
