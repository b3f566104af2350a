"""The host's stores hold one contract on NATS and in one process: heartbeats (a node's latest
has a revision that changes with each one, and a watch gives each new one), GPU samples (each
node's latest), the workloads' output (an attempt's chunks, from a time on, as they come; where
a replica's shipping got to) and the checkpoint store (an object replaced whole, its digest)."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator

from cluster.servers import NatsServer
from services.runtime.checkpoint_bucket import CheckpointStore, digest_of
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.gpu_samples import GpuSample, GpuSamples, NodeSamples
from services.runtime.heartbeats import Heartbeats
from services.runtime.host import InProcessHost, NatsHost
from services.runtime.logstream import log_subject
from services.runtime.output import Chunk, Output


async def holds_the_contract(beats: Heartbeats) -> None:
    assert await beats.get("n0") is None
    await beats.put("n0")
    first = await beats.get("n0")
    await beats.put("n0")
    second = await beats.get("n0")
    assert first is not None and second is not None and second != first
    assert await beats.get("n1") is None


async def watches(beats: Heartbeats) -> None:
    """A watch gives each node's latest heartbeat, then every new one, in order."""
    await beats.put("n0")
    await beats.put("n0")
    latest = await beats.get("n0")
    watch = beats.watch()
    try:
        assert await anext_within(watch) == ("n0", latest)  # the latest only, not the first
        await beats.put("n1")
        assert await anext_within(watch) == ("n1", await beats.get("n1"))
        await beats.put("n0")
        node, revision = await anext_within(watch)
        assert node == "n0" and revision == await beats.get("n0") and revision != latest
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


async def anext_within(watch: AsyncIterator[tuple[str, int]]) -> tuple[str, int]:
    async with asyncio.timeout(5):
        return await anext(watch)


def samples(node: str, at: float) -> NodeSamples:
    gpu = GpuSample(index=0, utilization=50.0)
    return NodeSamples(
        node=node, time=at, source="nvml", every_s=5.0, idle_after_s=900.0, gpus=(gpu,)
    )


async def keeps_samples(store: GpuSamples) -> None:
    assert await store.read(["n0"]) == []
    await store.put(samples("n1", 1.0))
    await store.put(samples("n0", 1.0))
    await store.put(samples("n0", 2.0))
    assert await store.read(["n1", "n0", "n2"]) == [samples("n0", 2.0), samples("n1", 1.0)]


async def keeps_checkpoints(store: CheckpointStore) -> None:
    """A put replaces the object whole; its size and digest are what the bytes give."""
    assert await store.info("j/replica-0") is None
    await store.put("j/replica-0", io.BytesIO(b"first"))
    put = await store.put("j/replica-0", io.BytesIO(b"second"))
    assert (put.size, put.digest) == (6, digest_of(b"second"))
    assert await store.info("j/replica-0") == put
    into = io.BytesIO()
    assert await store.get("j/replica-0", into) == put
    assert into.getvalue() == b"second"
    assert await store.info("j/replica-1") is None


async def reads_output(output: Output) -> None:
    """An attempt's chunks from its start or from a time, its alone, and those still coming;
    where each replica's shipping got to."""

    async def ship(chunk: Chunk) -> None:
        await output.ship(time.time(), chunk)

    reader = output
    at = [log_subject("n0", "j", 1, r) for r in (0, 1)]
    assert await output.shipped_so_far(at[0]) == (0, False)
    await ship(Chunk(at[0], 0, b"one\n"))
    await ship(Chunk(log_subject("n0", "j", 2, 0), 0, b"another attempt\n"))
    await asyncio.sleep(0.05)
    middle = time.time()
    await asyncio.sleep(0.05)
    await ship(Chunk(at[1], 0, b"two\n"))
    whole = await reader.open("j", 1, None)
    assert whole is not None and whole.pending == 2
    assert await whole.fetch(2.0) == [Chunk(at[0], 0, b"one\n"), Chunk(at[1], 0, b"two\n")]
    assert whole.pending == 0
    later = asyncio.create_task(whole.fetch(5.0))
    await asyncio.sleep(0.1)
    await ship(Chunk(at[0], 4, b"", end=True))
    assert await later == [Chunk(at[0], 4, b"", end=True)]
    assert await output.shipped_so_far(at[0]) == (4, True)
    assert await output.shipped_so_far(at[1]) == (4, False)
    await whole.close()
    since = await reader.open("j", 1, middle)
    assert since is not None and since.pending == 2
    assert [c.data for c in await since.fetch(2.0)] == [b"two\n", b""]
    assert await since.fetch(0.1) == []
    await since.close()


async def test_the_stores_on_nats(nats_server: NatsServer) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    host = NatsHost(log)
    try:
        await holds_the_contract(host.heartbeats(ttl_s=30.0))
        await watches(host.heartbeats(ttl_s=30.0))
        await keeps_samples(host.gpu_samples())
        await keeps_checkpoints(host.checkpoints())
        assert await host.output().open("j", 1, None) is None  # no output stream yet
        await reads_output(host.output())  # the first ship makes the stream
    finally:
        await log.nc.close()


async def test_the_stores_in_one_process() -> None:
    host = InProcessHost()
    await holds_the_contract(host.heartbeats())
    await watches(InProcessHost().heartbeats())
    await keeps_samples(host.gpu_samples())
    await keeps_checkpoints(host.checkpoints())
    await reads_output(host.output())
