"""The volume allowlist through the API, on real nats-server and PostgreSQL with the ledger and
admission answering: only an admin changes it, everyone reads it, and a refusal names the
field and the value."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from cluster.servers import NatsServer, Postgres
from events import NodeRegistered
from events.commands import SetProject
from services.admission.service import Admission
from services.api.app import Settings, create_app
from services.ledger.service import Ledger
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait
from tests.protocols import Service
from tests.read_side import serve

pytestmark = [pytest.mark.nats]


@contextlib.asynccontextmanager
async def deciders(url: str) -> AsyncIterator[None]:
    """The ledger and admission, on a stream with one node and project `a`."""
    log = JetStreamLog(await connect(url, "test"))
    await log.ensure_stream()
    await log.publish(
        NodeRegistered(id="n0/registered", time=0.0, actor="t", node="n0", pool="gpu", gpus=4)
    )
    service_logs = [JetStreamLog(await connect(url, name)) for name in ("ledger", "admission")]
    services: list[Service] = [Ledger(service_logs[0]), Admission(service_logs[1])]
    tasks = [asyncio.create_task(s.run()) for s in services]
    try:
        for _ in range(100):  # until the ledger answers
            with contextlib.suppress(Exception):
                if (await send(log.nc, SetProject(project="a", pool="gpu"))).ok:
                    break
            await asyncio.sleep(0.05)
        yield
    finally:
        for task in tasks:
            await cancel_and_wait(task)
        for service_log in service_logs:
            await service_log.nc.close()
        await log.nc.close()


async def test_the_allowlist_through_the_api(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin-token"
    app = create_app(Settings(nats_server.url, postgres_server.uri, token_file))
    async with (
        deciders(nats_server.url),
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30) as c,
    ):
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        made = await c.post("/v1/tokens", json={"name": "t", "projects": ["a"]}, headers=admin)
        team = {"Authorization": f"Bearer {made.json()['token']}"}
        assert (await c.get("/v1/volumes", headers=team)).json() == []
        not_admin = await c.post("/v1/volumes", json={"host_prefix": "/data"}, headers=team)
        assert not_admin.status_code == 403, not_admin.text
        relative = await c.post("/v1/volumes", json={"host_prefix": "data"}, headers=admin)
        assert relative.status_code == 422 and relative.json()["field"] == "host_prefix"
        assert "host prefix 'data' is not an absolute path" in relative.json()["error"]
        allowed = await c.post("/v1/volumes", json={"host_prefix": "/data/"}, headers=admin)
        assert allowed.status_code == 200, allowed.text
        listed = (await c.get("/v1/volumes", headers=team)).json()
        assert listed == [{"prefix": "/data", "read_write": False}]

        async def submit(volume: dict[str, object]) -> httpx.Response:
            job = {"job_id": f"j{len(str(volume))}", "project": "a", "volumes": [volume]}
            return await c.post("/v1/jobs", json=job, headers=team)

        outside = await submit({"host": "/etc", "container": "/in"})
        assert outside.status_code == 422 and outside.json()["field"] == "volumes"
        assert outside.json()["error"] == (
            "volume /etc:/in:ro: host path /etc is not under an allowed prefix "
            "(allowed: /data (read-only))"
        )
        writable = await submit({"host": "/data/x", "read_only": False})
        assert writable.status_code == 422 and "/data is allowed read-only" in writable.text
        inside = await submit({"host": "/data/imagenet", "container": "/in"})
        assert inside.status_code == 201 and inside.json()["type"] == "JobAdmitted", inside.text
        denied = await c.delete("/v1/volumes", params={"prefix": "/data"}, headers=admin)
        assert denied.status_code == 200 and denied.json()["event"]["grants"] == []
        assert (await c.get("/v1/volumes", headers=team)).json() == []
        again = await c.delete("/v1/volumes", params={"prefix": "/data"}, headers=admin)
        assert again.status_code == 422 and again.json()["field"] == "host_prefix", again.text
