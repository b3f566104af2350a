"""Snapshots through a real nats-server: the ledger takes them, a restarting service starts
from the newest and replays only the tail, and a snapshot it cannot use is ignored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import (
    Event,
    JobAdmitted,
    JobRejected,
    JobSpec,
    NodeRegistered,
    ProjectConfigured,
    ProjectTerms,
)
from events.commands import SubmitJob
from policy.snapshot import encode_snapshot
from policy.state import ClusterState
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.follower import Follower
from services.runtime.snapshots import SnapshotStore, Snapshotter
from services.runtime.tasks import cancel_and_wait
from tests.test_snapshot import SCENARIOS, scenario_log

pytestmark = pytest.mark.nats


def busiest_log() -> list[Event]:
    logs = [scenario_log(p)[0] for p in SCENARIOS]
    return max(logs, key=len)


@pytest.fixture
async def log(nats_server: NatsServer) -> AsyncIterator[JetStreamLog]:
    event_log = JetStreamLog(await connect(nats_server.url, "test"))
    await event_log.ensure_stream()
    yield event_log
    await event_log.nc.close()


async def publish_all(log: JetStreamLog, events: list[Event]) -> None:
    for event in events:
        await log.publish(event)


async def full_replay(log: JetStreamLog) -> Follower:
    follower = Follower(log)
    await follower.catch_up()
    return follower


async def test_a_restart_starts_from_the_snapshot_and_folds_the_same(log: JetStreamLog) -> None:
    events = busiest_log()
    assert len(events) > 60
    await publish_all(log, events)
    store = SnapshotStore(log.js)
    taker = Follower(log, snapshotter=Snapshotter(store, every=25))
    await taker.catch_up()
    assert taker.snapshotter is not None
    await taker.snapshotter.close()
    taken = taker.snapshotter.last_seq
    assert taken >= 25

    restarted = Follower(log, snapshots=store)
    applied = await restarted.catch_up()
    assert restarted.restored_from == taken
    assert applied == taker.applied_seq - taken  # only the tail was read
    straight = await full_replay(log)
    assert restarted.applied_seq == straight.applied_seq
    # events_applied counts from the snapshot's own count on: equal as well
    assert encode_snapshot(restarted.state, 0) == encode_snapshot(straight.state, 0)


async def test_the_ledger_takes_snapshots_as_events_arrive(log: JetStreamLog) -> None:
    ledger = Ledger(log, snapshot_every=20)
    running = asyncio.create_task(ledger.run())
    try:
        await publish_all(log, busiest_log())
        store = SnapshotStore(log.js)
        for _ in range(100):
            restored = await store.load()
            if restored is not None and restored[1] >= 20:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the ledger took no snapshot")
        state, seq = restored
        expected = ClusterState()
        async for stored in log.read(1):
            if stored.seq > seq:
                break
            expected.apply(stored.event)
        assert encode_snapshot(state, seq) == encode_snapshot(expected, seq)
    finally:
        await cancel_and_wait(running)


async def test_a_snapshot_from_another_stream_is_ignored(log: JetStreamLog) -> None:
    events = busiest_log()[:10]
    await publish_all(log, events)
    store = SnapshotStore(log.js)
    await store.save(encode_snapshot(ClusterState(), 1_000_000), 1_000_000)
    follower = Follower(log, snapshots=store)
    assert await follower.catch_up() == 10
    assert follower.restored_from is None


async def test_an_unreadable_snapshot_is_ignored(log: JetStreamLog, tmp_path: Path) -> None:
    await publish_all(log, busiest_log()[:10])
    store = SnapshotStore(log.js)
    await store.save(b"\x93not a snapshot at all", 5)
    follower = Follower(log, snapshots=store)
    assert await follower.catch_up() == 10
    assert follower.restored_from is None


async def test_admission_restored_from_a_snapshot_answers_repeats_alike(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    """A repeated submission of a job admission knows only from the snapshot gets the verdict
    it got the first time, read back from the stream; another key is refused."""
    await publish_all(
        log,
        [
            NodeRegistered(id="n1", time=0.0, actor="t", node="n1", pool="default", gpus=4),
            ProjectConfigured(
                id="a", time=0.0, actor="t", project="a", terms={"default": ProjectTerms(quota=4)}
            ),
        ],
    )
    first_log = JetStreamLog(await connect(nats_server.url, "admission-1"))
    first = Admission(first_log)
    running = asyncio.create_task(first.run())
    admitted = await send(
        log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a"), idempotency_key="k1")
    )
    rejected = await send(
        log.nc, SubmitJob(job_id="j2", spec=JobSpec(project="x"), idempotency_key="k2")
    )
    assert admitted.ok and isinstance(admitted.event, JobAdmitted)
    assert not rejected.ok and isinstance(rejected.event, JobRejected)
    await cancel_and_wait(running)
    await first_log.nc.close()  # as if its process ended: nobody answers for it any more

    folded = await full_replay(log)
    await SnapshotStore(log.js).save(
        encode_snapshot(folded.state, folded.applied_seq), folded.applied_seq
    )
    second_log = JetStreamLog(await connect(nats_server.url, "admission-2"))
    second = Admission(second_log)
    running = asyncio.create_task(second.run())
    try:
        again = await send(
            log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a"), idempotency_key="k1")
        )
        assert second.follower.restored_from == folded.applied_seq
        assert "j1" not in second.keys  # known from the snapshot only
        assert again.ok and again.event == admitted.event
        refused = await send(
            log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a"), idempotency_key="k9")
        )
        assert refused.error == "job id 'j1' already exists"
        repeat = await send(
            log.nc, SubmitJob(job_id="j2", spec=JobSpec(project="x"), idempotency_key="k2")
        )
        assert not repeat.ok and repeat.event == rejected.event
        fresh = await send(log.nc, SubmitJob(job_id="j3", spec=JobSpec(project="a")))
        assert fresh.ok
    finally:
        await cancel_and_wait(running)
        await second_log.nc.close()
