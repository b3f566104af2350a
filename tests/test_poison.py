"""One bad event must not stop the cluster: against a running embedded cluster (`fairlane up`:
nats-server, PostgreSQL, the services, a node executor, the projector and the API).

- A spec near the bus's message limit is refused at admission, naming the bound and the field.
- An event the node watcher cannot relay (written straight onto the log by an admin, past
  admission) is set aside, recorded on the log and shown by `fairlane status`; jobs submitted
  after it start and show in the list. Before, the watcher crash-looped on it and no job
  started on any node again.
- A NUL in a command is refused by the API, naming the field; an event holding NUL written
  straight to the log is projected with the NUL escaped (U+FFFD), and an event whose rows
  PostgreSQL refuses for good is set aside: later jobs show in the list. Before, the projector
  retried either for ever and every read model froze.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from cluster.cluster_file import ClusterFile
from cluster.embedded import down, up
from events import (
    EventSetAside,
    JobAdmitted,
    JobPriorityChanged,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    Replica,
    WorkRelayed,
    encode_event,
    work_subject,
)
from events.catalogue import JobWork
from events.commands import MAX_SPEC_BYTES
from services.runtime.auth import ADMIN, load_credentials
from services.runtime.eventlog import JetStreamLog, connect

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
PROJECT = "team"
#: nats-server's default max_payload, which the embedded cluster keeps
MAX_PAYLOAD = 1024 * 1024


@dataclass
class Cluster:
    info: ClusterFile
    data: Path
    api: httpx.AsyncClient
    log: JetStreamLog


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    # outside pytest's folder, which other pytest runs make private again: PostgreSQL runs
    # as another user (see the postgres_server fixture)
    with tempfile.TemporaryDirectory(prefix="fairlane-poison-") as folder:
        data = Path(folder) / "fl"
        info = await up(data, gpus=8, insecure_same_user=True)
        admin = Path(info.admin_token_file).read_text().strip()
        creds = load_credentials(Path(info.credentials_dir) / f"{ADMIN}.json")
        nc = await connect(info.nats_url, "test-admin", credentials=creds)
        try:
            async with httpx.AsyncClient(
                base_url=info.api_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
            ) as api:
                await until(lambda: get(api, "/v1/nodes"), lambda n: len(n) == 1, "node")
                made = await api.put(f"/v1/projects/{PROJECT}", json={"quota": 8})
                assert made.status_code == 200, made.text
                yield Cluster(info, data, api, JetStreamLog(nc))
        finally:
            await nc.close()
            await down(data)


async def get(api: httpx.AsyncClient, path: str) -> Any:
    response = await api.get(path)
    response.raise_for_status()
    return response.json()


async def until(
    read: Callable[[], Any], holds: Callable[[Any], bool], what: str, within: float = 60.0
) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    seen = None
    while True:
        try:
            seen = await read()
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            seen = None
        if seen is not None and holds(seen):
            return seen
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: last seen {seen!r}")
        await asyncio.sleep(0.3)


async def submit(c: Cluster, job_id: str, **fields: Any) -> dict[str, Any]:
    answer = await c.api.post("/v1/jobs", json={"job_id": job_id, "project": PROJECT, **fields})
    assert answer.status_code == 201, answer.text
    event: dict[str, Any] = answer.json()["event"]
    return event


async def past_admission(
    c: Cluster, job_id: str, spec: JobSpec, like: dict[str, Any] | None
) -> int:
    """Write a submission and (given `like`, an ordinary job's `JobAdmitted`, for its pools)
    its admission straight onto the log, as an admin can. Returns the submission's sequence."""
    now = time.time()
    submitted = JobSubmitted(id=f"{job_id}/submitted", time=now, actor="admin", job_id=job_id,
                             spec=spec)  # fmt: skip
    seq = await c.log.publish(submitted)
    if like is None:
        return seq
    admitted = JobAdmitted(id=f"{job_id}/admitted", time=now, actor="admin", job_id=job_id,
                           project=spec.project, priority=0, preemptible=True, gpus=spec.gpus,
                           replicas=1, min_replicas=1, pools=tuple(like["pools"]))  # fmt: skip
    await c.log.publish(admitted)
    return seq


async def set_aside(c: Cluster, service: str) -> list[EventSetAside]:
    found = [s.event async for s in c.log.read(1, subject=f"fl.aside.{service}")]
    return [e for e in found if isinstance(e, EventSetAside)]


def fairlane_status(data: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAIRLANE_CONFIG": str(data / "no-config.yaml"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "status", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


async def test_a_spec_near_the_bus_limit_is_refused_naming_the_bound(cluster: Cluster) -> None:
    # 250 arguments of 4,000 characters: within every per-field bound, about 1 MB in all
    near_limit = {"job_id": "huge", "project": PROJECT, "command": ["x" * 4000] * 250}
    answer = await cluster.api.post("/v1/jobs", json=near_limit)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["field"] == "spec"
    assert str(MAX_SPEC_BYTES) in error["error"] and "`command`" in error["error"]
    assert "1000" in error["error"]  # the actual size, in bytes (1,000,xxx)


async def test_an_event_the_node_watcher_cannot_relay_is_set_aside(cluster: Cluster) -> None:
    first = await submit(cluster, "before")
    # a spec whose submission fits in one message, and whose relay to the node (the same
    # spec, with the placement and the job's state around it) does not
    spec = JobSpec(project=PROJECT, gpus=1, command=("x",))
    probe = JobSubmitted(
        id="oversized/submitted", time=time.time(), actor="admin", job_id="oversized", spec=spec
    )
    # (100 bytes: room for its one header, the message id)
    room = MAX_PAYLOAD - 100 - len(encode_event(probe))
    spec = msgspec.structs.replace(spec, command=("x" * (room + 1),))
    relay = WorkRelayed(
        id="work/n/1", time=0.0, actor="nodewatch", node="n", source_seq=1,
        event=JobScheduled(id="s", time=0.0, actor="s", job_id="oversized", attempt=1,
                           pool="default", replicas=(Replica("n", (0,)),)),
        jobs=(JobWork(job_id="oversized", attempt=1, phase="starting", spec=spec),),
    )  # fmt: skip
    assert len(encode_event(relay)) > MAX_PAYLOAD  # (the premise)
    seq = await past_admission(cluster, "oversized", spec, first)

    asides = await until(lambda: set_aside(cluster, "nodewatch"), bool, "set aside")
    assert [a.subject for a in asides] == [work_subject(cluster.info.node)]
    assert "max_payload" in asides[0].reason
    placed = await anext(aiter(cluster.log.read(asides[0].seq)))  # the placement relayed
    assert isinstance(placed.event, JobScheduled) and placed.event.job_id == "oversized"
    assert placed.seq > seq

    for i in range(3):
        await submit(cluster, f"after-{i}")
    for i in range(3):
        read = functools.partial(get, cluster.api, f"/v1/jobs/after-{i}")
        await until(read, lambda j: j["state"] == "running", f"after-{i} runs")
    listed = await get(cluster.api, f"/v1/jobs?project={PROJECT}&limit=500")
    states = {j["job_id"]: j["state"] for j in listed["items"]}
    assert {states[f"after-{i}"] for i in range(3)} == {"running"}

    status = await asyncio.to_thread(fairlane_status, cluster.data)
    assert f"nodewatch set aside event {placed.seq}" in status.stderr, status.stderr
    assert "read models at event" in status.stdout, status.stdout


async def test_nul_is_refused_at_the_edge_naming_the_field(cluster: Cluster) -> None:
    answer = await cluster.api.post(
        "/v1/jobs", json={"job_id": "nul", "project": PROJECT, "command": ["a\u0000b"]}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == "command[0]" and "NUL" in answer.json()["error"]
    answer = await cluster.api.post(
        "/v1/jobs", json={"job_id": "nul", "project": PROJECT, "env": {"A": "a\u0000b"}}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == "env[...]" and "NUL" in answer.json()["error"]


async def test_what_the_read_models_cannot_hold_does_not_freeze_them(cluster: Cluster) -> None:
    # NUL in an argument and in the environment, as a log written before the edges refused
    # it holds: projected, the NUL escaped (not admitted: no executor is asked to run it)
    nul = JobSpec(project=PROJECT, gpus=1, command=("sleep", "1\u0000"), env=("A=\u0000",))
    await past_admission(cluster, "nul-job", nul, None)
    # a number no column holds (a log written before the bounds): set aside
    await past_admission(cluster, "huge-priority", JobSpec(project=PROJECT), None)
    huge_seq = await cluster.log.publish(
        JobPriorityChanged(
            id="huge/priority",
            time=time.time(),
            actor="admin",
            job_id="huge-priority",
            priority=1 << 40,
        )
    )
    await submit(cluster, "read-after")

    after = await until(lambda: get(cluster.api, "/v1/jobs/read-after"), bool, "later job")
    assert after["project"] == PROJECT
    listed = await get(cluster.api, f"/v1/jobs?project={PROJECT}&limit=500")
    assert {"nul-job", "read-after"} <= {j["job_id"] for j in listed["items"]}
    timeline = (await get(cluster.api, "/v1/jobs/nul-job/timeline"))["items"]
    submitted = next(e for e in timeline if e["type"] == "JobSubmitted")
    assert submitted["event"]["spec"]["command"] == ["sleep", "1\ufffd"]
    assert submitted["event"]["spec"]["env"] == ["A=\ufffd"]

    asides = await until(lambda: set_aside(cluster, "projector"), bool, "set aside")
    assert [a.seq for a in asides] == [huge_seq]
    assert "out of int32 range" in asides[0].reason or "out of range" in asides[0].reason
    # pause, resume and delete of a later job answer (they answered 404 while frozen)
    paused = await cluster.api.post("/v1/jobs/read-after/pause")
    assert paused.status_code == 200, paused.text

    metrics = (await cluster.api.get("/metrics")).text
    assert "fairlane_projector_lag_events" in metrics
    await until(lambda: cluster.api.get("/metrics"),
                lambda m: 'fairlane_events_set_aside_total{service="projector"} 1.0' in m.text,
                "the set-aside counted")  # fmt: skip
    status = await asyncio.to_thread(fairlane_status, cluster.data)
    assert f"projector set aside event {huge_seq}" in status.stderr, status.stderr
