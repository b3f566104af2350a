"""The Run:AI exercise driven through the HTTP API of a running embedded cluster (`fairlane
up`: nats-server, PostgreSQL, the services, a node executor running real workloads, the
projector and the API)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.cluster_file import ClusterFile
from cluster.embedded import down, up

pytestmark = [pytest.mark.nats, pytest.mark.slow]


@pytest.fixture
async def cluster() -> AsyncIterator[ClusterFile]:
    # outside pytest's folder, which other pytest runs make private again: PostgreSQL runs
    # as another user (see the postgres_server fixture)
    with tempfile.TemporaryDirectory(prefix="fairlane-up-") as folder:
        # its jobs run this run's interpreter, which may sit where no job's own user may
        # run it (root's home): workloads as users of their own are tests/test_tenant.py's
        info = await up(Path(folder) / "fl", gpus=8, insecure_same_user=True)
        try:
            yield info
        finally:
            await down(Path(folder) / "fl")


async def until(
    read: Callable[[], Any], holds: Callable[[Any], bool], what: str, within: float = 60.0
) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            seen = await read()
        except (httpx.HTTPError, KeyError, IndexError, ValueError):  # not projected yet
            seen = None
        if seen is not None and holds(seen):
            return seen
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: last seen {seen!r}")
        await asyncio.sleep(0.2)


async def test_runai_exercise_through_the_api(cluster: ClusterFile) -> None:
    admin = {"Authorization": f"Bearer {Path(cluster.admin_token_file).read_text().strip()}"}
    assert Path(cluster.admin_token_file).stat().st_mode & 0o777 == 0o600
    async with httpx.AsyncClient(base_url=cluster.api_url, timeout=30) as c:

        async def get(path: str, headers: dict[str, str] = admin) -> Any:
            response = await c.get(path, headers=headers)
            response.raise_for_status()
            return response.json()

        await until(lambda: get("/v1/nodes"), lambda n: len(n) == 1, "the node registered")
        for project in ("project-a", "project-b"):
            made = await c.put(f"/v1/projects/{project}", json={"quota": 4}, headers=admin)
            assert made.status_code == 200, made.text
            assert made.json()["type"] == "ProjectConfigured"
        team_b = await c.post(
            "/v1/tokens", json={"name": "team-b", "projects": ["project-b"]}, headers=admin
        )
        team_b_auth = {"Authorization": f"Bearer {team_b.json()['token']}"}

        def usage(project: str) -> Callable[[], Any]:
            async def read() -> tuple[int, int, int]:
                (pool,) = (await get(f"/v1/projects/{project}"))["pools"]
                return pool["usage"], pool["quota"], pool["fair_share"]

            return read

        def job(job_id: str) -> Callable[[], Any]:
            return lambda: get(f"/v1/jobs/{job_id}")

        training = {"job_id": "large-training-job", "project": "project-a", "class": "train",
                    "gpus": 8}  # fmt: skip
        submitted = await c.post("/v1/jobs", json=training, headers=admin)
        assert submitted.status_code == 201, submitted.text
        await until(job("large-training-job"), lambda j: j["state"] == "running", "training runs")
        assert (await until(usage("project-a"), lambda u: u[0] == 8, "8/4"))[:2] == (8, 4)

        workspace = {"job_id": "jupyter-workspace", "project": "project-b",
                     "class": "interactive", "gpus": 4}  # fmt: skip
        refused = await c.post("/v1/jobs", json={**training, "job_id": "x"}, headers=team_b_auth)
        assert refused.status_code == 403 and "project-a" in refused.json()["error"]
        submitted = await c.post("/v1/jobs", json=workspace, headers=team_b_auth)
        assert submitted.status_code == 201, submitted.text
        await until(job("jupyter-workspace"), lambda j: j["state"] == "running", "workspace runs")
        waiting = await until(
            job("large-training-job"), lambda j: j["state"] == "pending", "training waits"
        )
        assert waiting["preemptions"] == 1
        assert waiting["pending_reason"]["code"] == "fair_share_reached"
        assert "jupyter-workspace" in waiting["pending_reason"]["message"]
        assert await until(usage("project-b"), lambda u: u[0] == 4, "4/4") == (4, 4, 4)
        assert await until(usage("project-a"), lambda u: u[0] == 0, "a gave back") == (0, 4, 4)

        deleted = await c.delete("/v1/jobs/jupyter-workspace", headers=team_b_auth)
        assert deleted.status_code == 200 and deleted.json()["type"] == "JobCancelled"
        back = await until(
            job("large-training-job"), lambda j: j["state"] == "running" and j["attempt"] == 2,
            "training back",
        )  # fmt: skip
        assert back["gpus_held"] == 8
        assert (await until(usage("project-a"), lambda u: u[0] == 8, "8/4 again"))[:2] == (8, 4)

        timeline = (await get("/v1/jobs/large-training-job/timeline"))["items"]
        kinds = [e["type"] for e in timeline if e["applied"]]
        at = kinds.index("JobPreemptionRequested")
        request = [e for e in timeline if e["applied"]][at]
        assert request["reason"] == "reclaim" and request["for_job"] == "jupyter-workspace"
        assert request["event"]["facts"]["fair_share"] == {"project-a": 4, "project-b": 4}
        # (JobNominated: the workspace's GPUs may still be on their way back when the next
        # cycle runs; the training job then waits for them, nominated, by rule 7)
        rest = [k for k in kinds[at + 1 :] if k not in ("JobCheckpointed", "JobNominated")]
        assert rest[:3] == ["JobPreempted", "JobScheduled", "JobStarted"]
        (preemption,) = await get("/v1/preemptions?victim=large-training-job")
        assert preemption["beneficiary"] == "jupyter-workspace"

        # the node taken out of service: only an admin may; an unknown node is named
        (node,) = await get("/v1/nodes")
        name = node["node"]
        refused = await c.post(f"/v1/nodes/{name}/drain", json={}, headers=team_b_auth)
        assert refused.status_code == 403, refused.text
        unknown = await c.post("/v1/nodes/gpu9/drain", json={}, headers=admin)
        assert unknown.status_code == 422 and "'gpu9'" in unknown.json()["error"], unknown.text
        assert unknown.json()["field"] == "node"
        drained = await c.post(
            f"/v1/nodes/{name}/drain", json={"reason": "driver upgrade"}, headers=admin
        )
        assert drained.status_code == 200 and drained.json()["type"] == "NodeCordoned"
        await until(job("large-training-job"), lambda j: j["state"] == "pending", "drained")
        await until(lambda: get("/v1/nodes"), lambda n: n[0]["cordon"] == "drained", "shown")
        stops = [e for e in (await get("/v1/jobs/large-training-job/timeline"))["items"]
                 if e["type"] == "JobPreemptionRequested" and e["applied"]]  # fmt: skip
        assert stops[-1]["reason"] == "drain"
        back_in = await c.post(f"/v1/nodes/{name}/uncordon", json={}, headers=admin)
        assert back_in.status_code == 200 and back_in.json()["type"] == "NodeUncordoned"
        resumed = await until(
            job("large-training-job"), lambda j: j["state"] == "running" and j["attempt"] == 3,
            "training resumes once the node is back",
        )  # fmt: skip
        assert resumed["preemptions"] == 1  # a drain is not a preemption to make room

        # the read models made again from the whole log, beside the running projector
        rebuild = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fairlane.cli", "projections", "rebuild",
            "--data-dir", cluster.data_dir,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await rebuild.communicate()
        assert rebuild.returncode == 0 and b"rebuilt the read models" in out, out
        again = (await get("/v1/jobs/large-training-job/timeline"))["items"]
        assert again[: len(timeline)] == timeline
