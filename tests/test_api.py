"""The HTTP API on real nats-server and PostgreSQL: the read models of the Run:AI exercise
(played on the core engine, its log written to the stream and projected), access, errors,
the live stream and the metrics."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cluster.servers import NatsServer, Postgres
from events import JobMessage, NodeLost
from services.api import live
from services.api.app import Settings, create_app
from services.projector.service import Projector
from services.runtime.eventlog import JetStreamLog, connect
from tests.read_side import publish_all, serve
from tests.test_projections import exercise_log

pytestmark = [pytest.mark.nats]


@dataclass
class Api:
    client: httpx.AsyncClient
    admin: dict[str, str]
    last_seq: int
    token_file: Path
    base_url: str


@pytest.fixture
async def api(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> AsyncIterator[Api]:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    last = await publish_all(log, exercise_log())
    await Projector(log, postgres_server.uri).rebuild()
    token_file = tmp_path / "admin-token"
    app = create_app(Settings(nats_server.url, postgres_server.uri, token_file))
    async with serve(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        yield Api(client, admin, last, token_file, base_url)
    await log.nc.close()


async def test_docs_and_schema_are_served(api: Api) -> None:
    schema = (await api.client.get("/docs/openapi.json")).json()
    assert "/v1/jobs" in schema["paths"] and "/v1/jobs/{job_id}/timeline" in schema["paths"]
    page = await api.client.get("/docs")
    assert page.status_code == 200
    # the page's script is served here, not from a CDN: /docs works offline
    assert '<script src="/docs-assets/redoc.standalone.js" crossorigin>' in page.text
    assert "https://" not in page.text, page.text  # nothing from elsewhere
    bundle = await api.client.get("/docs-assets/redoc.standalone.js")
    assert bundle.status_code == 200 and len(bundle.content) > 500_000
    assert "javascript" in bundle.headers["content-type"]
    assert (await api.client.get("/docs/swagger")).status_code == 200
    assert api.token_file.stat().st_mode & 0o777 == 0o600


async def test_tokens_are_needed_and_scoped(api: Api) -> None:
    c = api.client
    missing = await c.get("/v1/jobs")
    assert missing.status_code == 401 and missing.json()["field"] == "Authorization"
    wrong = await c.get("/v1/jobs", headers={"Authorization": "Bearer fl_nope"})
    assert wrong.status_code == 401
    made = await c.post("/v1/tokens", json={"name": "team-b", "projects": ["project-b"]},
                        headers=api.admin)  # fmt: skip
    assert made.status_code == 201
    team_b = {"Authorization": f"Bearer {made.json()['token']}"}
    assert (await c.get("/v1/jobs", headers=team_b)).status_code == 200
    refused = await c.delete("/v1/jobs/large-training-job", headers=team_b)
    assert refused.status_code == 403 and "'project-a'" in refused.json()["error"]
    refused = await c.post("/v1/jobs", json={"job_id": "x", "project": "project-a"},
                           headers=team_b)  # fmt: skip
    assert refused.status_code == 403 and refused.json()["field"] == "project"
    not_admin = await c.put("/v1/projects/project-b", json={"quota": 8}, headers=team_b)
    assert not_admin.status_code == 403
    again = await c.post("/v1/tokens", json={"name": "team-b"}, headers=api.admin)
    assert again.status_code == 409 and again.json()["field"] == "name"
    listed = (await c.get("/v1/tokens", headers=api.admin)).json()
    assert {t["name"] for t in listed} == {"admin", "team-b"}
    assert all("token" not in t for t in listed)


async def test_tokens_expire_are_revoked_and_say_who_they_are(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, h = api.client, api.admin
    started = time.time()
    made = await c.post("/v1/tokens", json={"name": "ci", "projects": ["project-b"],
                                            "expires_in_s": 3600}, headers=h)  # fmt: skip
    assert made.status_code == 201 and abs(made.json()["expires_at"] - started - 3600) < 60
    ci = {"Authorization": f"Bearer {made.json()['token']}"}
    me = (await c.get("/v1/whoami", headers=ci)).json()
    assert me == {"name": "ci", "admin": False, "projects": ["project-b"],
                  "expires_at": made.json()["expires_at"]}  # fmt: skip
    assert (await c.get("/v1/whoami", headers=h)).json()["admin"] is True
    listed = {t["name"]: t for t in (await c.get("/v1/tokens", headers=h)).json()}
    assert listed["ci"]["expires_at"] == made.json()["expires_at"]
    assert "expires_at" not in listed["admin"] and listed["admin"]["created_at"] > 0
    short = await c.post("/v1/tokens", json={"name": "x", "expires_in_s": 5}, headers=h)
    assert short.status_code == 400 and short.json()["field"] == "expires_in_s"
    # two hours on, the token is refused, saying why
    later = started + 7200
    monkeypatch.setattr("services.api.tokens.time.time", lambda: later)
    expired = await c.get("/v1/jobs", headers=ci)
    assert expired.status_code == 401 and "API token ci has expired" in expired.json()["error"]
    monkeypatch.undo()
    assert (await c.get("/v1/jobs", headers=ci)).status_code == 200
    revoked = await c.delete("/v1/tokens/ci", headers=h)
    assert revoked.status_code == 200 and revoked.json()["name"] == "ci"
    assert (await c.get("/v1/jobs", headers=ci)).status_code == 401
    again = await c.delete("/v1/tokens/ci", headers=h)
    assert again.status_code == 404 and again.json()["field"] == "name"
    own = await c.delete("/v1/tokens/admin", headers=h)
    assert own.status_code == 422 and (await c.get("/v1/jobs", headers=h)).status_code == 200


async def test_bad_input_names_the_field(api: Api) -> None:
    c = api.client
    page = await c.get("/v1/jobs", params={"limit": 0}, headers=api.admin)
    assert page.status_code == 400 and page.json()["field"] == "limit"
    assert page.json()["error"].endswith("(in query)"), page.text
    backwards = await c.get("/v1/audit", params={"from": 5, "to": 1}, headers=api.admin)
    assert backwards.status_code == 400 and backwards.json()["field"] == "to", backwards.text
    state = await c.get("/v1/jobs", params={"state": "sleeping"}, headers=api.admin)
    assert state.status_code == 400 and state.json()["field"] == "state"
    body = await c.post("/v1/jobs", json={"job_id": "a b", "project": "p"}, headers=api.admin)
    assert body.status_code == 400 and body.json()["field"] == "job_id"
    gpus = await c.post("/v1/jobs", json={"job_id": "j", "project": "p", "gpus": -1},
                        headers=api.admin)  # fmt: skip
    assert gpus.status_code == 400 and gpus.json()["field"] == "gpus"
    assert gpus.json()["error"].startswith("gpus: "), gpus.text  # the message names it too
    kind = await c.get("/v1/timeline", params={"type": ["JobStarted", "Jb\x00"]},
                       headers=api.admin)  # fmt: skip
    assert kind.status_code == 400 and kind.json()["field"] == "type"
    missing = await c.get("/v1/jobs/ghost", headers=api.admin)
    assert missing.status_code == 404 and missing.json()["field"] == "job_id"
    resume = await c.get("/v1/events", headers={**api.admin, "Last-Event-ID": "x1"})
    assert resume.status_code == 400 and resume.json()["field"] == "Last-Event-ID"
    quota = await c.put("/v1/projects/p", json={"quota": -1}, headers=api.admin)
    assert quota.status_code == 400 and quota.json()["field"] == "quota", quota.text
    # rule 11's bounds, named with the value
    for sent, field, named in (
        ({"usage_half_life_s": 0}, "usage_half_life_s", "got 0.0s"),
        ({"usage_half_life_s": -60}, "usage_half_life_s", "got -60.0s"),
        ({"usage_half_life_s": 7200, "usage_k": -1}, "usage_k", "got -1.0"),
    ):
        bad = await c.put("/v1/pools/default", json=sent, headers=api.admin)
        assert bad.status_code == 400 and bad.json()["field"] == field, bad.text
        assert named in bad.json()["error"]


async def test_jobs_timeline_projects_and_metrics(api: Api) -> None:
    c, h = api.client, api.admin
    jobs = (await c.get("/v1/jobs", params={"project": "project-a"}, headers=h)).json()
    assert [j["job_id"] for j in jobs["items"]] == ["large-training-job"]
    assert jobs["items"][0]["state"] == "running" and jobs["items"][0]["preemptions"] == 1
    page = (await c.get("/v1/jobs", params={"limit": 1}, headers=h)).json()
    second = await c.get("/v1/jobs", params={"limit": 1, "after": page["next"]}, headers=h)
    assert [j["job_id"] for j in second.json()["items"]] == ["jupyter-workspace"]
    assert second.json()["next"] is None
    timeline = (await c.get("/v1/jobs/large-training-job/timeline", headers=h)).json()["items"]
    kinds = [e["type"] for e in timeline]
    request = timeline[kinds.index("JobPreemptionRequested")]
    assert request["reason"] == "reclaim" and request["for_job"] == "jupyter-workspace"
    assert request["event"]["facts"]["fair_share"] == {"project-a": 4, "project-b": 4}
    # when the workspace is deleted, its GPUs are on their way back: the training job waits for
    # them, nominated (rule 7), then starts on them
    assert kinds[kinds.index("JobPreemptionRequested") :] == [
        "JobPreemptionRequested", "JobPreempted", "JobNominated", "JobScheduled", "JobStarted",
    ]  # fmt: skip
    preempted_at = timeline[kinds.index("JobPreempted")]["seq"]
    then = (await c.get(f"/v1/jobs/large-training-job/as-of/{preempted_at}", headers=h)).json()
    assert (then["state"], then["attempt"], then["gpus_held"]) == ("pending", 1, 0)
    early = await c.get("/v1/jobs/large-training-job/as-of/2", headers=h)
    assert early.status_code == 404
    only = await c.get("/v1/timeline", params={"type": ["JobPreempted"]}, headers=h)
    assert {e["job_id"] for e in only.json()["items"]} == {"large-training-job",
                                                           "jupyter-workspace"}  # fmt: skip
    node = (await c.get("/v1/nodes/node-1/timeline", params={"limit": 3}, headers=h)).json()
    assert node["items"][0]["type"] == "NodeRegistered" and node["next"] is not None
    then = await c.get(f"/v1/projects/project-a/as-of/{preempted_at}", headers=h)
    assert [(p["pool"], p["usage"], p["quota"]) for p in then.json()] == [
        ("single-node-pool", 0, 4)
    ]
    # replicas asked to stop no longer count (as the ledger counts): 8 until the request
    asked_at = request["seq"]
    before = (await c.get(f"/v1/projects/project-a/as-of/{asked_at - 1}", headers=h)).json()
    assert before[0]["usage"] == 8 and before[0]["over_quota"] is False  # no ledger here
    project = (await c.get("/v1/projects/project-a", headers=h)).json()
    (terms,) = project["pools"]
    assert (terms["usage"], terms["quota"], terms["fair_share"]) == (8, 4, 8)
    (victim,) = (await c.get("/v1/preemptions", headers=h)).json()
    assert victim["victim"] == "large-training-job" and victim["beneficiary"] == "jupyter-workspace"
    pools = (await c.get("/v1/pools", headers=h)).json()
    assert pools == [{"pool": "single-node-pool", "nodes": 1, "gpus": 8, "free": 0,
                      "allocated": 8, "queued_jobs": 0}]  # fmt: skip
    text = (await c.get("/metrics")).text
    assert 'fairlane_pool_gpus_allocated{pool="single-node-pool"} 8.0' in text
    assert 'fairlane_project_gpus_used{pool="single-node-pool",project="project-a"} 8.0' in text
    assert 'fairlane_preemptions_total{reason="reclaim"} 1.0' in text
    assert "fairlane_submit_to_start_seconds_bucket" in text
    health = (await c.get("/v1/health")).json()
    assert health == {"projected_seq": api.last_seq, "log_seq": api.last_seq}


async def test_a_timeline_newest_first_and_pages_back(api: Api) -> None:
    c, h = api.client, api.admin
    path = "/v1/jobs/large-training-job/timeline"
    whole = [e["seq"] for e in (await c.get(path, headers=h)).json()["items"]]
    newest = (await c.get(path, params={"newest": "true", "limit": 2}, headers=h)).json()
    assert [e["seq"] for e in newest["items"]] == whole[-2:]  # the last two, in log order
    assert newest["next"] == whole[-2]  # `before` for the earlier ones
    earlier = await c.get(path, params={"newest": "true", "before": newest["next"]}, headers=h)
    assert [e["seq"] for e in earlier.json()["items"]] == whole[:-2]
    assert earlier.json()["next"] is None
    stops: dict[str, str | int] = {"newest": "true", "limit": 1, "type": "JobPreempted"}
    (last,) = (await c.get("/v1/timeline", params=stops, headers=h)).json()["items"]
    assert last["type"] == "JobPreempted" and last["job_id"] == "jupyter-workspace"


@pytest.fixture
async def api_node_lost(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> AsyncIterator[Api]:
    """The exercise, then the loss of the node the training job runs on."""
    events = exercise_log()
    lost = NodeLost(id="node-1/lost", time=events[-1].time + 5, actor="nodewatch",
                    node="node-1", reason="no heartbeat for 30 s")  # fmt: skip
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    last = await publish_all(log, [*events, lost])
    await Projector(log, postgres_server.uri).rebuild()
    token_file = tmp_path / "admin-token"
    app = create_app(Settings(nats_server.url, postgres_server.uri, token_file))
    async with serve(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        yield Api(client, admin, last, token_file, base_url)
    await log.nc.close()


async def test_a_lost_node_is_on_the_timeline_of_the_job_it_stopped(api_node_lost: Api) -> None:
    c, h = api_node_lost.client, api_node_lost.admin
    path = "/v1/jobs/large-training-job/timeline"
    timeline = (await c.get(path, headers=h)).json()["items"]
    last = timeline[-1]
    assert [e["type"] for e in timeline[-2:]] == ["JobStarted", "NodeLost"]
    assert last["job_id"] == "large-training-job" and last["nodes"] == ["node-1"]
    assert last["project"] == "project-a" and last["reason"] == "no heartbeat for 30 s"
    newest = (await c.get(path, params={"newest": "true", "limit": 1}, headers=h)).json()
    assert [e["type"] for e in newest["items"]] == ["NodeLost"]
    # the workspace's attempt had ended (deleted) before: not its loss
    gone = await c.get("/v1/jobs/jupyter-workspace/timeline", headers=h)
    assert "NodeLost" not in [e["type"] for e in gone.json()["items"]]
    job = (await c.get("/v1/jobs/large-training-job", headers=h)).json()
    assert job["state"] == "pending"  # queued again


async def test_an_image_or_a_volume_is_refused_where_the_nodes_run_processes(
    nats_server: NatsServer, postgres_server: Postgres, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin-token"
    settings = Settings(nats_server.url, postgres_server.uri, token_file, node_runtime="process")
    async with serve(create_app(settings)) as base_url, httpx.AsyncClient(base_url=base_url) as c:
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        job = {"job_id": "j", "project": "p", "image": "pytorch/pytorch:2.4", "command": ["true"]}
        refused = await c.post("/v1/jobs", json=job, headers=admin)
        mounted = {"job_id": "j", "project": "p", "volumes": [{"host": "/datasets"}]}
        unmounted = await c.post("/v1/jobs", json=mounted, headers=admin)
    assert refused.status_code == 422 and refused.json()["field"] == "image", refused.text
    said = refused.json()["error"]
    assert "run workloads as processes" in said and "'pytorch/pytorch:2.4'" in said
    assert unmounted.status_code == 422 and unmounted.json()["field"] == "volumes"
    assert "the volume '/datasets' would not be mounted" in unmounted.json()["error"]


async def test_a_team_reads_only_its_own_projects_jobs(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token for project-b sees its jobs, their timelines and the preemption made for them;
    project-a's jobs, timelines, logs and live events are not its to read (403 naming the
    project), though nodes, pools and projects' standing are everyone's."""
    c = api.client
    made = await c.post("/v1/tokens", json={"name": "team-b", "projects": ["project-b"]},
                        headers=api.admin)  # fmt: skip
    team_b = {"Authorization": f"Bearer {made.json()['token']}"}
    jobs = (await c.get("/v1/jobs", headers=team_b)).json()["items"]
    assert [j["job_id"] for j in jobs] == ["jupyter-workspace"]
    for path in ("/v1/jobs/large-training-job", "/v1/jobs/large-training-job/timeline",
                 "/v1/jobs/large-training-job/logs", "/v1/projects/project-a/timeline",
                 "/v1/events?job=large-training-job", "/v1/jobs?project=project-a"):  # fmt: skip
        refused = await c.get(path, headers=team_b)
        assert refused.status_code == 403, path
        assert "'project-a'" in refused.json()["error"], path
    whole = (await c.get("/v1/timeline", params={"limit": 500}, headers=team_b)).json()
    assert {e["project"] for e in whole["items"]} <= {"project-b", None}
    assert any(e["job_id"] == "jupyter-workspace" for e in whole["items"])
    (made_room,) = (await c.get("/v1/preemptions", headers=team_b)).json()
    assert made_room["beneficiary"] == "jupyter-workspace"
    assert (await c.get("/v1/projects", headers=team_b)).status_code == 200
    monkeypatch.setattr(live, "KEEP_ALIVE_S", 0.3)
    headers = {**team_b, "Last-Event-ID": str(api.last_seq - 2)}
    async with c.stream("GET", "/v1/events", headers=headers) as response:
        async with asyncio.timeout(10):
            async for line in response.aiter_lines():  # project-a's last two events: not sent
                assert not line.startswith("id:"), line
                if line.startswith(":"):
                    break


async def test_the_policy_re_derives_the_decisions_on_the_log(api: Api) -> None:
    """`/v1/audit` runs the policy again on the state each decision was made from; a job's
    timeline with `rederive` says of each decision that the policy gives it."""
    c = api.client
    report = (await c.get("/v1/audit", headers=api.admin)).json()
    assert report["checked"] >= 4 and report["matched"] == report["checked"], report
    assert report["mismatched"] == 0
    scoped = (await c.get("/v1/audit", params={"job": "jupyter-workspace", "to": api.last_seq},
                          headers=api.admin)).json()  # fmt: skip
    assert 0 < scoped["checked"] < report["checked"]
    timeline = await c.get("/v1/jobs/large-training-job/timeline",
                           params={"rederive": "true"}, headers=api.admin)  # fmt: skip
    items = timeline.json()["items"]
    said = {e["type"]: e["rederived"] for e in items}
    assert said["JobScheduled"] == said["JobPreemptionRequested"] == "matches", said
    assert said["JobSubmitted"] is None and said["JobStarted"] is None
    made = await c.post("/v1/tokens", json={"name": "team-a", "projects": ["project-a"]},
                        headers=api.admin)  # fmt: skip
    team_a = {"Authorization": f"Bearer {made.json()['token']}"}
    assert (await c.get("/v1/audit", headers=team_a)).status_code == 403
    mine = await c.get("/v1/audit", params={"job": "large-training-job"}, headers=team_a)
    assert mine.status_code == 200 and mine.json()["mismatched"] == 0


async def test_live_stream_resumes_after_last_event_id(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "KEEP_ALIVE_S", 0.3)
    headers = {**api.admin, "Last-Event-ID": str(api.last_seq - 2)}
    seen: list[tuple[str, str]] = []
    async with api.client.stream("GET", "/v1/events", headers=headers) as response:
        assert response.status_code == 200
        async with asyncio.timeout(10):
            async for line in response.aiter_lines():
                if line.startswith(("id:", "event:")):
                    key, _, value = line.partition(":")
                    seen.append((key, value.strip()))
                if line.startswith(":"):  # the log is quiet now: a keep-alive comment
                    break
    assert sorted(seen) == sorted([
        ("id", str(api.last_seq - 1)), ("event", "JobScheduled"),
        ("id", str(api.last_seq)), ("event", "JobStarted"),
    ])  # fmt: skip


async def test_a_jobs_live_stream_carries_its_nodes_reports(
    api: Api, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's report is on `fl.job.<job>.<event>.<node>`, a token more than the job's
    other events: the job's own stream still carries it."""
    monkeypatch.setattr(live, "KEEP_ALIVE_S", 0.3)
    log = JetStreamLog(await connect(nats_server.url, "test"))
    said = JobMessage(id="said", time=1.0, actor="n0", job_id="large-training-job", attempt=1,
                      text="hello", node="n0")  # fmt: skip
    seq = await log.publish(said)
    await log.nc.close()
    headers = {**api.admin, "Last-Event-ID": str(seq - 1)}
    seen: list[str] = []
    params = {"job": "large-training-job"}
    async with api.client.stream("GET", "/v1/events", headers=headers, params=params) as response:
        assert response.status_code == 200
        async with asyncio.timeout(10):
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    seen.append(line.partition(":")[2].strip())
                if line.startswith(":"):
                    break
    assert seen == ["JobMessage"]


@pytest.mark.slow
async def test_schemathesis_finds_no_server_error(
    api: Api, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Generated requests for every documented operation (the live stream aside: it never
    ends) against the API with admission and the ledger running: no 500, every status and
    body as documented."""
    services = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", f"services.{name}", "--nats", nats_server.url,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        for name in ("admission", "ledger")
    ]  # fmt: skip
    try:
        run = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "schemathesis"), "run",
            f"{api.base_url}/docs/openapi.json",
            "--header", f"Authorization: {api.admin['Authorization']}",
            "--checks", "not_a_server_error,status_code_conformance,"
            "content_type_conformance,response_schema_conformance",
            "--exclude-path", "/v1/events",
            "--max-examples", "15", "--seed", "7", "--request-timeout", "30",
            "--suppress-health-check", "all",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=tmp_path,  # its cache of crashes stays out of the repository
        )  # fmt: skip
        out, _ = await run.communicate()
    finally:
        for process in services:
            process.terminate()
            await process.wait()
    report = out.decode(errors="replace")
    assert run.returncode == 0, report[-6000:]


async def test_read_models_unreachable_is_503(api: Api, postgres_server: Postgres) -> None:
    await postgres_server.stop()
    answer = await api.client.get("/v1/jobs", headers=api.admin)
    assert answer.status_code == 503 and "unavailable" in answer.json()["error"]
