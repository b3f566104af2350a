"""Malformed requests get a 400 naming what is wrong, never a 500, and the live streams are
capped exactly (real nats-server and PostgreSQL, the API served in process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from cluster.servers import NatsServer, Postgres
from services.api.app import Settings, create_app
from services.api.errors import MAX_BODY_BYTES
from services.runtime.eventlog import JetStreamLog, connect
from tests.read_side import serve

pytestmark = [pytest.mark.nats]
STREAMS = 8


def refused(answer: httpx.Response, field: str) -> str:
    """The answer is a 400 naming `field`; its error message."""
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.text
    error: str = answer.json()["error"]
    return error


@pytest.fixture
async def api(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    nc = await connect(nats_server.url, "test")
    await JetStreamLog(nc).ensure_stream()
    token_file = tmp_path / "admin-token"
    settings = Settings(nats_server.url, postgres_server.uri, token_file, max_streams=STREAMS)
    async with (
        serve(create_app(settings)) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
    ):
        yield client, {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    await nc.close()


async def test_a_malformed_body_is_a_400(api: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    c, admin = api
    json_headers = {**admin, "Content-Type": "application/json"}
    bad_utf8 = await c.post("/v1/jobs", content=b'{"job_id": "\xff\xfe", "project": "p"}',
                            headers=json_headers)  # fmt: skip
    assert bad_utf8.status_code == 400, bad_utf8.text
    assert bad_utf8.json()["field"] == "body"
    deep = await c.post("/v1/jobs", content=b"[" * 100_000 + b"]" * 100_000,
                        headers=json_headers)  # fmt: skip
    assert deep.status_code == 400, deep.text
    not_json = await c.put("/v1/projects/p", content=b"{", headers=json_headers)
    assert not_json.status_code == 400, not_json.text


async def test_a_body_that_is_not_json_or_none_at_all_names_the_body(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    json_headers = {**admin, "Content-Type": "application/json"}
    # Litestar's own messages, as they were: "Input data was truncated" and "Number out of
    # range" with no field, "data: 'data'" for no body, "data" for what a client calls the body
    for body, said in ((b"{", "truncated"), (b'{"job_id": "j", "gpus": 1e400}', "out of range")):
        answer = await c.post("/v1/jobs", content=body, headers=json_headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["field"] == "body", answer.text
        assert answer.json()["error"].startswith("the body is not JSON this API reads: ")
        assert said in answer.json()["error"]
    empty = await c.post("/v1/jobs", content=b"", headers=json_headers)
    assert refused(empty, "body") == "body: a JSON body is needed (in body)"
    array = await c.post("/v1/jobs", content=b"[]", headers=json_headers)
    refused(array, "body")
    missing = await c.post("/v1/jobs", json={"job_id": "j"}, headers=admin)
    refused(missing, "project")


async def test_a_bad_query_or_path_parameter_is_named_with_its_value(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    limit = await c.get("/v1/jobs", params={"limit": "-5"}, headers=admin)
    assert refused(limit, "limit") == 'limit: Expected `int` >= 1, given "-5" (in query)'
    job = await c.get("/v1/jobs/%2e%2e", headers=admin)
    assert 'given ".." (in path)' in refused(job, "job_id")
    first = await c.get("/v1/audit", params={"from": "-1"}, headers=admin)  # (alias of first)
    assert refused(first, "from") == 'from: Expected `int` >= 1, given "-1" (in query)'


async def test_a_word_not_among_its_choices_is_said_with_them(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    state = await c.get("/v1/jobs", params={"state": "done"}, headers=admin)
    assert refused(state, "state") == (
        "state: Invalid enum value 'done', given \"done\"; one of submitted, pending, starting, "
        "running, stopping, paused, completed, failed, cancelled, rejected (in query)"
    )
    fitting = await c.put("/v1/pools/default", json={"fitting": "tight"}, headers=admin)
    assert refused(fitting, "fitting") == (
        "fitting: Invalid enum value 'tight', given \"tight\"; one of best, worst (in body)"
    )
    scheduler = await c.put("/v1/pools/default", json={"scheduler": "fifo"}, headers=admin)
    assert "; one of fair_share, priority, round_robin (in body)" in scheduler.json()["error"]


async def test_types_are_strict(api: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    c, admin = api
    gpus = await c.post("/v1/jobs", json={"job_id": "j", "project": "p", "gpus": "1"},
                        headers=admin)  # fmt: skip
    assert gpus.status_code == 400, gpus.text
    assert gpus.json()["field"] == "gpus" and "`int`" in gpus.json()["error"]
    assert gpus.json()["error"].startswith("gpus: ") and 'given "1"' in gpus.json()["error"]
    negative = await c.post("/v1/jobs", json={"job_id": "j", "project": "p", "gpus": -1},
                            headers=admin)  # fmt: skip
    assert negative.status_code == 400 and "given -1" in negative.json()["error"], negative.text
    quota = await c.put("/v1/projects/p", json={"quota": "4"}, headers=admin)
    refused(quota, "quota")


async def test_names_with_a_trailing_newline_are_refused(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    job = await c.post("/v1/jobs", json={"job_id": "j\n", "project": "p"}, headers=admin)
    refused(job, "job_id")
    project = await c.post("/v1/jobs", json={"job_id": "j", "project": "p\n"}, headers=admin)
    refused(project, "project")
    token = await c.post("/v1/tokens", json={"name": "t\n"}, headers=admin)
    refused(token, "name")


async def test_a_body_over_the_limit_is_refused_naming_the_limit(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    body = b'{"job_id": "j", "project": "p", "command": ["' + b"x" * MAX_BODY_BYTES + b'"]}'
    answer = await c.post("/v1/jobs", content=body, headers=admin)
    assert answer.status_code == 413, answer.text
    assert answer.json()["field"] == "body"
    assert f"{MAX_BODY_BYTES:,} bytes" in answer.json()["error"]


async def test_an_oversized_last_event_id_is_refused(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api
    # past 64 bits (the reader retried five times a second), past 2^62, a digit not ASCII
    for said in ("9" * 24, "18446744073709551616", str((1 << 62) + 1), "\u00b2"):
        headers = {**admin, "Last-Event-ID": said}
        async with asyncio.timeout(10):  # (taken, it is a stream that never ends)
            answer = await c.get(
                "/v1/events", headers={k.encode(): v.encode() for k, v in headers.items()}
            )
        assert answer.status_code == 400, (said, answer.text)
        assert answer.json()["field"] == "Last-Event-ID"
    huge = await c.get("/v1/events", params={"after": str(1 << 63)}, headers=admin)
    refused(huge, "after")


async def test_the_live_stream_cap_is_exact(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    c, admin = api

    async def open_one() -> int:
        async with c.stream("GET", "/v1/events", headers=admin) as response:
            if response.status_code == 200:
                await asyncio.sleep(2.0)  # hold it while the others try
            return response.status_code

    statuses = await asyncio.gather(*(open_one() for _ in range(3 * STREAMS)))
    assert statuses.count(200) == STREAMS, statuses
    assert statuses.count(503) == 2 * STREAMS, statuses
    # and every place is given back once they close
    statuses = await asyncio.gather(*(open_one() for _ in range(STREAMS)))
    assert statuses.count(200) == STREAMS, statuses
