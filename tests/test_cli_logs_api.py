"""`GET /v1/jobs/{id}/logs` on real nats-server and PostgreSQL: output chunks published to the
log stream as executors publish them (a chunk twice, two replicas, end markers) read back
whole, by attempt, followed until the attempt is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cluster.servers import NatsServer, Postgres
from services.api.app import Settings, create_app
from services.projector.service import Projector
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.logstream import (
    END_HEADER,
    LOG_STREAM,
    OFFSET_HEADER,
    ensure_log_stream,
    log_subject,
)
from tests.read_side import publish_all, serve
from tests.test_projections import exercise_log

pytestmark = [pytest.mark.nats]
JOB = "large-training-job"  # preempted once in the exercise: attempt 1 is over, 2 runs


@dataclass
class Api:
    client: httpx.AsyncClient
    log: JetStreamLog


@pytest.fixture
async def api(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> AsyncIterator[Api]:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    await publish_all(log, exercise_log())
    await Projector(log, postgres_server.uri).rebuild()
    token_file = tmp_path / "admin-token"
    app = create_app(Settings(nats_server.url, postgres_server.uri, token_file))
    async with serve(app) as base_url:
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
            yield Api(client, log)
    await log.nc.close()


async def ship(
    log: JetStreamLog, attempt: int, offset: int, data: bytes, end: bool = False
) -> None:
    """A chunk of replica 0's output, as an executor publishes it."""
    headers = {OFFSET_HEADER: str(offset), **({END_HEADER: "1"} if end else {})}
    subject = log_subject("node-1", JOB, attempt, 0)
    await log.js.publish(subject, data, stream=LOG_STREAM, headers=headers)


async def test_nothing_shipped_yet_is_empty_and_unknown_attempts_are_404(api: Api) -> None:
    empty = await api.client.get(f"/v1/jobs/{JOB}/logs")  # no stream at all yet
    assert empty.status_code == 200 and empty.text == ""
    missing = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"attempt": 3})
    assert missing.status_code == 404
    assert missing.json()["error"] == f"job {JOB!r} has had 2 attempt(s), not 3"
    unknown = await api.client.get("/v1/jobs/nobody/logs")
    assert unknown.status_code == 404 and unknown.json()["field"] == "job_id"
    bad = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"attempt": 0})
    assert bad.status_code == 400


async def test_an_attempt_is_read_whole_once_and_followed_to_its_end(api: Api) -> None:
    await ensure_log_stream(api.log.js)
    await ship(api.log, 1, 0, b"training: attempt 1\nstep")
    await ship(api.log, 1, 0, b"training: attempt 1\nstep")  # shipped again after a restart
    await ship(api.log, 1, 24, b" 1\nstopping at step 1: saved\n")
    await ship(api.log, 2, 0, b"training: attempt 2, from step 1\n")
    first = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"attempt": 1})
    assert first.text == "training: attempt 1\nstep 1\nstopping at step 1: saved\n"
    latest = await api.client.get(f"/v1/jobs/{JOB}/logs")
    assert latest.text == "training: attempt 2, from step 1\n"
    tail = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"attempt": 1, "max_bytes": 30})
    assert tail.text.startswith("[... ") and tail.text.endswith("stopping at step 1: saved\n")

    # attempt 1 is over: following it ends once its replica said it is done
    await ship(api.log, 1, 52, b"", end=True)
    followed = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"attempt": 1, "follow": True})
    assert followed.text == first.text

    # attempt 2 runs: following it gives what comes, as it comes
    async with api.client.stream("GET", f"/v1/jobs/{JOB}/logs", params={"follow": True}) as stream:
        chunks = stream.aiter_bytes()
        assert await anext(chunks) == b"training: attempt 2, from step 1\n"
        await ship(api.log, 2, 33, b"step 2\n")
        assert await asyncio.wait_for(anext(chunks), 10) == b"step 2\n"


async def test_output_since_a_time_is_what_was_shipped_from_then_on(api: Api) -> None:
    await ensure_log_stream(api.log.js)
    await ship(api.log, 2, 0, b"early line\n")
    await asyncio.sleep(1.2)  # (the stream keeps each message's time, to the nanosecond)
    cut = time.time()
    await asyncio.sleep(0.2)
    await ship(api.log, 2, 11, b"late line\n")
    everything = await api.client.get(f"/v1/jobs/{JOB}/logs")
    assert everything.text == "early line\nlate line\n"
    since = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"since": cut})
    assert since.status_code == 200 and since.text == "late line\n"
    past_dates = await api.client.get(f"/v1/jobs/{JOB}/logs", params={"since": 1e12})
    assert past_dates.status_code == 400 and past_dates.json()["field"] == "since"
