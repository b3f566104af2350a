"""The projector against real nats-server and PostgreSQL: incremental equals rebuilt, a kill -9
mid-batch loses and doubles nothing, a PostgreSQL restart is caught up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from pathlib import Path

import asyncpg
import pytest

from bench.projector import synthetic_log
from cluster.servers import NatsServer, Postgres
from projections import VERSION
from services.projector.service import Projector
from services.runtime.auth import projector_consumer
from services.runtime.eventlog import STREAM, JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait
from tests.read_side import dump, publish_all, wait_position

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def rebuilt(log: JetStreamLog, dsn: str) -> dict[str, list[tuple[object, ...]]]:
    last = await Projector(log, dsn).rebuild()
    assert last == await log.last_seq()
    return await dump(dsn)


async def test_incremental_equals_rebuild(
    nats_server: NatsServer, postgres_server: Postgres
) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    events = list(synthetic_log(6000, nodes=10))
    await publish_all(log, events[:2500])
    junk = await log.publish_raw("fl.job.j1.job_started", b"not an event")  # skipped, logged
    projector = Projector(log, postgres_server.uri, batch_max=300)
    task = asyncio.create_task(projector.run())
    try:
        for start in range(2500, 6000, 700):  # the tail arrives while it follows
            last = await publish_all(log, events[start : start + 700])
            await asyncio.sleep(0.05)
        await wait_position(postgres_server.uri, last)
    finally:
        await cancel_and_wait(task)
    incremental = await dump(postgres_server.uri)
    assert [r[0] for r in incremental["timeline"]] == [s for s in range(1, 6002) if s != junk]
    assert incremental == await rebuilt(log, postgres_server.uri)
    await log.nc.close()


async def test_read_models_of_another_projection_version_are_rebuilt(
    nats_server: NatsServer, postgres_server: Postgres
) -> None:
    """Rows written by an older projection (`projections.VERSION`) are made again from the
    log when a projector of this version starts, not left as they were: here a job row
    altered behind the projector's back, under version 1."""
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    last = await publish_all(log, synthetic_log(1500, nodes=5))
    expected = await rebuilt(log, postgres_server.uri)
    conn = await asyncpg.connect(postgres_server.uri)
    try:
        altered = await conn.fetchval("SELECT job_id FROM jobs ORDER BY job_id LIMIT 1")
        await conn.execute("UPDATE jobs SET gpus = 99 WHERE job_id = $1", altered)
        await conn.execute("UPDATE projector_position SET version = 1")
        task = asyncio.create_task(Projector(log, postgres_server.uri).run())
        try:
            for _ in range(600):  # rebuilt: back at the log's end, under this version
                got = await conn.fetchrow("SELECT seq, version FROM projector_position")
                if got is not None and (got["seq"], got["version"]) == (last, VERSION):
                    break
                await asyncio.sleep(0.05)
        finally:
            await cancel_and_wait(task)
    finally:
        await conn.close()
    assert (got["seq"], got["version"]) == (last, VERSION)
    assert await dump(postgres_server.uri) == expected  # the altered row included
    await log.nc.close()


async def _start_projector(
    nats_url: str, dsn: str, logs: Path, *extra: str
) -> asyncio.subprocess.Process:
    out = (logs / "projector.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.projector", "--nats", nats_url, "--postgres", dsn,
        *extra, stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    out.close()
    return process


async def _position(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT coalesce(max(seq), 0) FROM projector_position"))
    finally:
        await conn.close()


async def test_killed_mid_batch_loses_and_doubles_nothing(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    dsn = postgres_server.uri
    events = list(synthetic_log(30_000, nodes=20))
    writer = asyncio.create_task(publish_all(log, events, chunk=500))
    rng = random.Random(11)
    kills = 0
    seen: list[int] = []
    process = await _start_projector(nats_server.url, dsn, tmp_path)
    try:
        while kills < 4:
            # each kill lands once the new projector is writing (a busy machine can take
            # seconds to start one), at a random moment of its work
            target = (seen[-1] if seen else 0) + 1
            if writer.done():  # the whole log may be projected already
                target = min(target, writer.result())
            await wait_position(dsn, target)
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            before = await _position(dsn)
            process.send_signal(signal.SIGKILL)  # wherever it is: likely inside a write
            await process.wait()
            kills += 1
            seen.append(before)
            process = await _start_projector(nats_server.url, dsn, tmp_path)
        last = await writer
        await wait_position(dsn, last, within=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        await process.wait()
    assert seen[-1] > 0, f"the projector never got going between kills: {seen}"
    incremental = await dump(dsn)
    assert [r[0] for r in incremental["timeline"]] == list(range(1, 30_001))
    assert incremental == await rebuilt(log, dsn)
    await log.nc.close()


async def test_postgres_restart_is_caught_up(
    nats_server: NatsServer, postgres_server: Postgres
) -> None:
    postgres = postgres_server
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    events = list(synthetic_log(8000, nodes=10))
    projector = Projector(log, postgres.uri, batch_max=200)
    task = asyncio.create_task(projector.run())
    try:
        await wait_position(postgres.uri, await publish_all(log, events[:2000]), projector=task)
        # PostgreSQL goes away, then events come that the projector must write: it loses its
        # connection whatever the machine's speed (stopped while events flowed, a fast run
        # had written them all before the stop)
        await postgres.stop()
        written = await publish_all(log, events[2000:], chunk=200)
        await asyncio.sleep(1.0)
        await postgres.start()
        await wait_position(postgres.uri, written, within=90, projector=task)
        incremental = await dump(postgres.uri)
    finally:
        await cancel_and_wait(task)
    assert projector.restarts >= 1  # it did lose PostgreSQL on the way
    assert len(incremental["timeline"]) == 8000
    assert incremental == await rebuilt(log, postgres.uri)
    await log.nc.close()


async def _projector_consumers(log: JetStreamLog) -> list[str]:
    return [
        c.name
        for c in await log.js.consumers_info(STREAM)
        if c.name is not None and c.name.startswith("projector-")
    ]


async def test_restarts_leave_no_consumer_behind(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    dsn = postgres_server.uri
    events = list(synthetic_log(400, nodes=2))
    await publish_all(log, events[:200])
    # killed three times, as the supervisor would restart it: its one consumer, taken back
    for round_ in range(3):
        process = await _start_projector(nats_server.url, dsn, tmp_path)
        start = 200 + 50 * round_
        await wait_position(dsn, await publish_all(log, events[start : start + 50]))
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert await _projector_consumers(log) == [projector_consumer()]
    # stopped (SIGTERM): its consumer goes with it
    process = await _start_projector(nats_server.url, dsn, tmp_path)
    await wait_position(dsn, await publish_all(log, events[350:]))
    assert await _projector_consumers(log) == [projector_consumer()]
    process.send_signal(signal.SIGTERM)
    await process.wait()
    assert await _projector_consumers(log) == []
    await log.nc.close()
