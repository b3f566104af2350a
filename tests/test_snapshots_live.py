"""Snapshots through a real nats-server: the ledger takes them, a restarting service starts
from the newest and replays only the tail, and a snapshot it cannot use is ignored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events import Event
from policy.snapshot import encode_snapshot
from policy.state import ClusterState
from services.ledger.service import Ledger
from services.runtime.eventlog import EventLog, connect
from services.runtime.follower import Follower
from services.runtime.servers import NatsServer
from services.runtime.snapshots import SnapshotStore, Snapshotter
from services.runtime.tasks import cancel_and_wait
from tests.test_snapshot import SCENARIOS, scenario_log

pytestmark = pytest.mark.nats


def busiest_log() -> list[Event]:
    logs = [scenario_log(p)[0] for p in SCENARIOS]
    return max(logs, key=len)  # type: ignore[return-value]


@pytest.fixture
async def log(nats_server: NatsServer) -> AsyncIterator[EventLog]:
    event_log = EventLog(await connect(nats_server.url, "test"))
    await event_log.ensure_stream()
    yield event_log
    await event_log.nc.close()


async def publish_all(log: EventLog, events: list[Event]) -> None:
    for event in events:
        await log.publish(event)


async def full_replay(log: EventLog) -> Follower:
    follower = Follower(log)
    await follower.catch_up()
    return follower


async def test_a_restart_starts_from_the_snapshot_and_folds_the_same(log: EventLog) -> None:
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


async def test_the_ledger_takes_snapshots_as_events_arrive(log: EventLog) -> None:
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


async def test_a_snapshot_from_another_stream_is_ignored(log: EventLog) -> None:
    events = busiest_log()[:10]
    await publish_all(log, events)
    store = SnapshotStore(log.js)
    await store.save(encode_snapshot(ClusterState(), 1_000_000), 1_000_000)
    follower = Follower(log, snapshots=store)
    assert await follower.catch_up() == 10
    assert follower.restored_from is None


async def test_an_unreadable_snapshot_is_ignored(log: EventLog, tmp_path: Path) -> None:
    await publish_all(log, busiest_log()[:10])
    store = SnapshotStore(log.js)
    await store.save(b"\x93not a snapshot at all", 5)
    follower = Follower(log, snapshots=store)
    assert await follower.catch_up() == 10
    assert follower.restored_from is None
