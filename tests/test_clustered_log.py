"""The event log on a replicated stream (three nats-servers in a cluster on loopback, the
stream kept three times, as deploy/compose.cluster.yaml runs it): a leader's fenced decisions,
many in flight at once, all land; a newer term still fences them out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from events import JobCancelled, LeaderElected
from services.runtime.eventlog import STREAM, SUBJECTS, Conflict, JetStreamLog, connect
from services.runtime.servers import NatsServer, free_port

pytestmark = pytest.mark.nats


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[list[NatsServer]]:
    routes = [free_port() for _ in range(3)]
    servers = []
    for i, route in enumerate(routes):
        config = tmp_path / f"n{i}.conf"
        others = ", ".join(f"nats://127.0.0.1:{r}" for r in routes)
        config.write_text(
            f"server_name: n{i}\n"
            f"cluster {{ name: fl, listen: 127.0.0.1:{route}, routes: [{others}] }}\n"
        )
        servers.append(NatsServer(store_dir=tmp_path / f"n{i}", config=config))
    try:
        await asyncio.gather(*(s.start() for s in servers))
        yield servers
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


async def replicated_log(url: str) -> JetStreamLog:
    log = JetStreamLog(await connect(url, "test"))
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
    cluster: list[NatsServer],
) -> None:
    log = await replicated_log(cluster[0].url)
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
