"""Benchmark: nats-server's memory after a long log, and what it is spent on.

Writes N events (default 1,000,000, the workload of bench.replay: each job's events on its own
subjects `fl.job.<id>.<event>`) into a fresh nats-server and reads the server's resident memory
(VmRSS) once they are stored. Three variants isolate the causes:

- `fairlane`: as the services write: a subject per job and event, a `Nats-Msg-Id` on each;
- `no-msg-id`: the same subjects without message ids (no duplicate-window entries);
- `few-subjects`: message ids, but every event on one of 8 subjects (no per-subject state).

    uv run python -m bench.nats_memory [--events 1000000] [--variant fairlane ...]
        [--settle-s 2] [-o json]

`--settle-s 130` measures after the stream's 2-minute duplicate window has passed, when the
server has dropped its message-id entries.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import cyclopts
import msgspec
from rich.console import Console
from rich.table import Table

from bench.options import Output, run_command
from bench.replay import workload
from cluster.servers import NatsServer
from events import encode_event, subject_for
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.main import configure_logging

Variant = Literal["fairlane", "no-msg-id", "few-subjects"]
VARIANTS: tuple[Variant, ...] = ("fairlane", "no-msg-id", "few-subjects")


@dataclass
class Figures:
    variant: str
    events: int
    subjects: int
    stream_mib: float
    rss_before_mib: float
    rss_after_mib: float
    write_s: float


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def measure(variant: Variant, total: int, settle_s: float) -> Figures:
    with tempfile.TemporaryDirectory(prefix="fairlane-memory-") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats")
        await server.start()
        assert server.process is not None
        try:
            log = JetStreamLog(await connect(server.url, "bench"))
            await log.ensure_stream()
            before = rss_mib(server.process.pid)
            events = workload(total)
            start = time.perf_counter()
            for i in range(0, total, 10_000):
                for n, event in enumerate(events[i : i + 10_000]):
                    subject = subject_for(event)
                    if variant == "few-subjects":
                        subject = f"fl.bench.{(i + n) % 8}"
                    headers = None if variant == "no-msg-id" else {"Nats-Msg-Id": event.id}
                    await log.nc.publish(subject, encode_event(event), headers=headers)
                await log.nc.flush(timeout=60)
            while await log.last_seq() < total:  # noqa: ASYNC110  (the server's count, polled)
                await asyncio.sleep(0.1)
            write_s = time.perf_counter() - start
            del events
            await asyncio.sleep(settle_s)  # let the server settle (flushes, GC, dedup expiry)
            # the raw answer: nats-py's StreamState leaves num_subjects out
            reply = await log.nc.request(f"$JS.API.STREAM.INFO.{log.stream}", b"", timeout=10)
            state = msgspec.json.decode(reply.data)["state"]
            after = rss_mib(server.process.pid)
            await log.nc.close()
        finally:
            await server.stop()
    return Figures(
        variant=variant,
        events=total,
        subjects=int(state.get("num_subjects", 0)),
        stream_mib=round(int(state["bytes"]) / 2**20, 1),
        rss_before_mib=before,
        rss_after_mib=after,
        write_s=round(write_s, 1),
    )


app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    events: int = 1_000_000,
    variant: list[Variant] | None = None,
    settle_s: float = 2.0,
    output: Output = "text",
) -> None:
    configure_logging("warning")
    figures = [asyncio.run(measure(v, events, settle_s)) for v in (variant or VARIANTS)]
    if output == "json":
        sys.stdout.write(msgspec.json.encode([asdict(f) for f in figures]).decode() + "\n")
        return
    table = Table(title=f"nats-server memory after {events:,} events")
    for column in ("variant", "subjects", "stream MiB", "RSS before MiB", "RSS after MiB", "s"):
        table.add_column(column)
    for f in figures:
        table.add_row(
            f.variant,
            f"{f.subjects:,}",
            str(f.stream_mib),
            str(f.rss_before_mib),
            str(f.rss_after_mib),
            str(f.write_s),
        )
    Console().print(table)


if __name__ == "__main__":
    run_command(app)
