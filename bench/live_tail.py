"""Benchmark: the CPU a service spends following the live tail of the log, per event.

A fresh nats-server; this process writes the events of `bench.replay`'s workload (jobs
submitted, admitted, scheduled, started and completed, each with its `Nats-Msg-Id`) at a steady
rate in small bursts, as a running cluster does; a child process follows them as a service
does (a durable consumer, acked, folded by a `Follower` into a `ClusterState`) and measures its
own CPU (`time.process_time`) from the first live event to the last. For comparison the child
then replays the same log in bulk with the same code. Reported per 1,000 events: the CPU of the
live tail and of the replay, and their ratio.

`--baseline REV` runs the reader on the code of git revision REV first, then on this tree's,
moments apart on the same machine, `--runs` times each, alternating (bench/revision.py); the
figures are each side's median.

    uv run python -m bench.live_tail [--events 20000] [--rate 2000] [--burst 5] [--runs 1]
        [--baseline main] [-o json]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import cyclopts
import msgspec
from nats.js.errors import NotFoundError
from rich.console import Console
from rich.table import Table

from bench.options import Output, run_command
from bench.replay import NODES, workload
from bench.revision import ROOT, check_out, child_output
from cluster.servers import NatsServer
from events import Event, encode_event, subject_for
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.follower import Follower
from services.runtime.main import configure_logging

#: the reader's durable consumer, as a service has one
CONSUMER = "bench-tail"
#: the cluster's nodes and project, written before the reader starts
SETUP = NODES + 1


@dataclass
class Reading:
    """What the reading process spent (one run)."""

    live_cpu_ms_per_1000: float
    replay_cpu_ms_per_1000: float
    live_wall_s: float


@dataclass
class Figures:
    revision: str
    events: int
    rate_per_s: int
    burst: int
    runs: int
    #: CPU milliseconds of the reader per 1,000 events, following the live tail (median)
    live_cpu_ms_per_1000: float
    #: the same events replayed in bulk by the same code (median)
    replay_cpu_ms_per_1000: float
    live_over_replay: float
    #: each run's live figure, in the order run
    live_runs: list[float]


async def _publish(log: JetStreamLog, events: list[Event], rate: int, burst: int) -> None:
    """`events` in bursts of `burst`, `rate` events a second on a fixed schedule."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(0, len(events), burst):
        for event in events[i : i + burst]:
            await log.nc.publish(
                subject_for(event), encode_event(event), headers={"Nats-Msg-Id": event.id}
            )
        await log.nc.flush()
        await asyncio.sleep(max(0.0, start + (i + burst) / rate - loop.time()))


async def _until_following(log: JetStreamLog) -> None:
    """Until the reader's durable consumer exists (it has replayed the setup)."""
    for _ in range(600):
        try:
            await log.js.consumer_info(log.stream, CONSUMER)
            await asyncio.sleep(0.5)  # its first pull request is out
            return
        except NotFoundError:
            await asyncio.sleep(0.1)
    raise RuntimeError("the reader never started following")


async def one_run(tree: Path, events: int, rate: int, burst: int, what: str) -> Reading:
    """A fresh server, the setup written, then `events` live while `tree`'s code reads them."""
    everything = workload(SETUP + events)
    with tempfile.TemporaryDirectory(prefix="fairlane-tail-") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats")
        await server.start()
        try:
            log = JetStreamLog(await connect(server.url, "bench-writer"))
            await log.ensure_stream()
            await _publish(log, everything[:SETUP], rate=1_000_000, burst=1000)
            request = msgspec.json.encode({"url": server.url, "events": events}).decode()
            reader = asyncio.create_task(
                asyncio.to_thread(child_output, tree, Path(__file__), request, what)
            )
            await _until_following(log)
            await _publish(log, everything[SETUP:], rate, burst)
            reading = msgspec.json.decode(await reader, type=Reading)
            await log.nc.close()
        finally:
            await server.stop()
    return reading


async def read(url: str, events: int) -> Reading:
    """In the child: follow the tail until `events` live events are folded, then replay."""
    log = JetStreamLog(await connect(url, "bench-reader"), durable=CONSUMER)
    follower = Follower(log)
    await follower.catch_up()
    assert follower.applied_seq == SETUP, follower.applied_seq
    following = asyncio.create_task(follower.run())
    await follower.wait_for(SETUP + 1, within=60.0)
    cpu, wall = time.process_time(), time.perf_counter()
    await follower.wait_for(SETUP + events, within=600.0)
    live_cpu, live_wall = time.process_time() - cpu, time.perf_counter() - wall
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)
    await log.drop_durable()
    replaying = Follower(JetStreamLog(log.nc))
    cpu = time.process_time()
    await replaying.catch_up()
    replay_cpu = time.process_time() - cpu
    assert replaying.state.live == follower.state.live  # the same fold either way
    await log.nc.close()
    return Reading(
        live_cpu_ms_per_1000=round(live_cpu * 1e6 / (events - 1), 2),
        replay_cpu_ms_per_1000=round(replay_cpu * 1e6 / replaying.applied_seq, 2),
        live_wall_s=round(live_wall, 2),
    )


def child(request: str) -> None:
    """In the reading process: `read` as asked, its figures written as JSON."""
    asked = msgspec.json.decode(request)
    configure_logging("error")
    reading = asyncio.run(read(asked["url"], asked["events"]))
    sys.stdout.write(msgspec.json.encode(reading).decode() + "\n")


def figures(revision: str, readings: list[Reading], events: int, rate: int, burst: int) -> Figures:
    live = statistics.median(r.live_cpu_ms_per_1000 for r in readings)
    replay = statistics.median(r.replay_cpu_ms_per_1000 for r in readings)
    return Figures(
        revision=revision,
        events=events,
        rate_per_s=rate,
        burst=burst,
        runs=len(readings),
        live_cpu_ms_per_1000=round(live, 2),
        replay_cpu_ms_per_1000=round(replay, 2),
        live_over_replay=round(live / replay, 2) if replay else 0.0,
        live_runs=[r.live_cpu_ms_per_1000 for r in readings],
    )


async def measure(
    events: int, rate: int, burst: int, runs: int, baseline: str | None, say: Console
) -> list[Figures]:
    """This tree's figures; first the baseline's, where one is named, run by turns."""
    trees = [("now", ROOT)]
    with tempfile.TemporaryDirectory(prefix="live-tail-baseline-") as tmp:
        if baseline is not None:
            check_out(baseline, Path(tmp))
            trees.insert(0, (baseline, Path(tmp)))
        readings: dict[str, list[Reading]] = {name: [] for name, _ in trees}
        for run in range(runs):
            for name, tree in trees:
                say.log(f"run {run + 1}/{runs}: {name}")
                readings[name].append(await one_run(tree, events, rate, burst, name))
    return [figures(name, readings[name], events, rate, burst) for name, _ in trees]


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    events: int = 20_000,
    rate: int = 2000,
    burst: int = 5,
    runs: int = 1,
    baseline: str | None = None,
    output: Output = "text",
) -> None:
    """Follow a live tail of EVENTS events and report the reader's CPU per 1,000 events.

    Parameters
    ----------
    events
        Events written live (after the cluster's setup).
    rate
        Events a second.
    burst
        Events written together (a job's ~5 events arrive close together).
    runs
        Runs of each side; the figures are medians.
    baseline
        A git revision (e.g. main): measure on its code too, by turns with this tree's.
    output
        text (a table) or json.
    """
    configure_logging("error")
    results = asyncio.run(measure(events, rate, burst, runs, baseline, Console(stderr=True)))
    if output == "json":
        sys.stdout.write(msgspec.json.encode([asdict(f) for f in results]).decode() + "\n")
        return
    table = Table(title=f"Following the live tail: {events:,} events at {rate:,}/s")
    table.add_column("figure")
    for f in results:
        table.add_column(f.revision, justify="right")
    for key in ("live_cpu_ms_per_1000", "replay_cpu_ms_per_1000", "live_over_replay", "runs"):
        table.add_row(key, *(f"{getattr(f, key):,}" for f in results))
    Console().print(table)


if __name__ == "__main__":
    run_command(app)
