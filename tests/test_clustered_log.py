"""The event log on a replicated stream (three nats-servers in a cluster on loopback, the
stream kept three times, as deploy/compose.cluster.yaml runs it): a leader's fenced decisions,
many in flight at once, all land; a newer term still fences them out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from cluster.servers import NatsServer, free_ports
from events import JobCancelled, LeaderElected
from services.runtime.auth import ADMIN, load_credentials, route_credentials, route_urls, write_auth
from services.runtime.auth import Cluster as AuthCluster
from services.runtime.eventlog import STREAM, SUBJECTS, Conflict, JetStreamLog, connect

pytestmark = pytest.mark.nats


@dataclass
class Cluster:
    servers: list[NatsServer]
    routes: list[str]  # each server's route address, host:port
    files: dict[str, Path]  # each user's credentials file
    data_dir: Path


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three servers whose routes log in (as `fairlane deploy secrets` writes them for
    deploy/compose.cluster.yaml), with the users and permissions of any Fairlane server."""
    ports = free_ports(6)  # at once: asked apart, two could be the same
    routes = [f"127.0.0.1:{port}" for port in ports[:3]]
    servers, files = [], {}
    for i, route in enumerate(routes):
        config = tmp_path / f"n{i}.conf"
        files = write_auth(tmp_path, config, [], cluster=AuthCluster("fl", route, routes))
        store = tmp_path / f"n{i}"
        servers.append(NatsServer(store, port=ports[3 + i], config=config, name=f"n{i}"))
    try:
        await asyncio.gather(*(s.start() for s in servers))
        yield Cluster(servers, routes, files, tmp_path)
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


async def replicated_log(cluster: Cluster) -> JetStreamLog:
    admin = load_credentials(cluster.files[ADMIN])
    log = JetStreamLog(await connect(cluster.servers[0].url, "test", credentials=admin))
    config = StreamConfig(name=STREAM, subjects=SUBJECTS, num_replicas=3, duplicate_window=120.0)
    for _ in range(150):  # until the cluster has elected its JetStream leaders
        try:
            await log.js.add_stream(config)
            break
        except (APIError, NoStreamResponseError, ServiceUnavailableError, TimeoutError):
            await asyncio.sleep(0.2)
    await log.ensure_stream()
    return log


def term(n: int) -> LeaderElected:
    return LeaderElected(
        id=f"scheduler/term/{n}", time=0.0, actor="test", kind="scheduler", holder="h", term=n
    )


async def test_a_window_of_fenced_decisions_lands_on_a_replicated_stream(
    cluster: Cluster,
) -> None:
    log = await replicated_log(cluster)
    info = await log.js.stream_info(STREAM)
    assert info.config.num_replicas == 3
    fence = ("fl.leader.scheduler", await log.publish_durably(term(1)))
    decisions = [JobCancelled(id=f"j{i}/c", time=0.0, actor="t", job_id=f"j{i}") for i in range(64)]
    seqs = await asyncio.gather(*(log.publish_durably(d, fence=fence) for d in decisions))
    assert len(set(seqs)) == len(decisions)  # every one stored, once
    await log.publish_durably(term(2))
    with pytest.raises(Conflict):  # the old term's write is refused at once
        await log.publish_durably(JobCancelled(id="late/c", time=0.0, actor="t", job_id="late"),
                                  fence=fence)  # fmt: skip
    await log.nc.close()


async def joined_by(cluster: Cluster, tmp_path: Path, routes: list[str]) -> bool:
    """Whether a fourth server, routing to the cluster with `routes`, joins it: a message
    published on it reaches a subscriber on the cluster (routes carry both)."""
    tmp_path.mkdir(parents=True)
    config = tmp_path / "stranger.conf"
    route, client = free_ports(2)
    listen = f"127.0.0.1:{route}"
    config.write_text(json.dumps({"cluster": {"name": "fl", "listen": listen, "routes": routes}}))
    stranger = NatsServer(tmp_path / "stranger", port=client, config=config, name="stranger")
    await stranger.start()
    admin = load_credentials(cluster.files[ADMIN])
    member = await connect(cluster.servers[0].url, "member", credentials=admin)
    outsider = await connect(stranger.url, "outsider")
    got: list[bytes] = []

    async def received(msg: Msg) -> None:
        got.append(msg.data)

    await member.subscribe("fl.probe", cb=received)
    await member.flush()
    try:
        for _ in range(40):  # routes connect within a second or two
            await outsider.publish("fl.probe", b"hello")
            await outsider.flush()
            await asyncio.sleep(0.1)
            if got:
                return True
        return False
    finally:
        await outsider.close()
        await member.close()
        await stranger.stop()


async def test_a_server_whose_route_does_not_log_in_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Anyone who reaches a route port would otherwise join as a server and see and send
    every message, whatever the users' permissions."""
    assert not await joined_by(cluster, tmp_path / "plain", [f"nats-route://{cluster.routes[0]}"])
    wrong = f"nats-route://route:wrong@{cluster.routes[0]}"
    assert not await joined_by(cluster, tmp_path / "wrong", [wrong])
    # the same server with the routes' password joins: the refusal was the password's doing
    creds = route_credentials(cluster.data_dir)
    assert await joined_by(cluster, tmp_path / "known", route_urls(creds, cluster.routes[:1]))
