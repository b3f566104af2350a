"""The node watcher's lapse rule on its own clock, in one process: a registered node whose
heartbeat has not changed for longer than the timeout is declared lost at the first poll after
that, and a node that keeps beating never is, whether or not the watch delivers its beats."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from events import NodeLost, NodeRegistered
from services.nodewatch.service import NodeWatch
from services.runtime.clock import VirtualClock
from services.runtime.heartbeats import MemoryHeartbeats
from services.runtime.host import InProcessHost
from services.runtime.memory_log import MemoryLog
from services.runtime.tasks import cancel_and_wait

START = 1_000.0
TIMEOUT_S = 10.0  # polls every second


class DeafHeartbeats(MemoryHeartbeats):
    """Heartbeats whose watch never delivers one: the watcher must read a node before it
    declares it lost."""

    async def watch(self) -> AsyncIterator[tuple[str, int]]:
        await asyncio.Event().wait()
        yield "", 0  # never reached


async def settle() -> None:
    for _ in range(100):
        await asyncio.sleep(0)


async def lost_at(beats: MemoryHeartbeats, beating: dict[str, list[float]]) -> dict[str, float]:
    """When each node was declared lost, its heartbeats sent at the given times (on a clock
    moved a second at a time for 30 s)."""
    log = MemoryLog()
    for node in ("n1", "n2"):
        await log.publish(
            NodeRegistered(id=f"{node}/r", time=START, actor=node, node=node, pool="p", gpus=1)
        )
    clock = VirtualClock(START)
    host = InProcessHost(log, _heartbeats=beats)
    watch = NodeWatch(log, timeout_s=TIMEOUT_S, clock=clock, host=host)
    running = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.leader.is_leader.wait(), 5)
        await settle()
        for second in range(31):
            clock.move_to(START + second)
            for node, times in beating.items():
                if START + second in times:
                    await beats.put(node)
            await settle()
    finally:
        await cancel_and_wait(running)
    return {s.event.node: s.event.time async for s in log.read() if isinstance(s.event, NodeLost)}


async def test_a_node_is_lost_at_the_first_poll_past_the_timeout_since_it_last_beat() -> None:
    every_2s = [START + t for t in range(0, 31, 2)]
    lost = await lost_at(MemoryHeartbeats(), {"n1": every_2s, "n2": [START + 3]})
    # n2's last beat was seen at +3: at +13 it has been unseen for exactly the timeout
    assert lost == {"n2": START + 14}


async def test_a_beat_the_watch_missed_is_read_before_a_node_is_declared() -> None:
    every_2s = [START + t for t in range(0, 31, 2)]
    lost = await lost_at(DeafHeartbeats(), {"n1": every_2s})
    # unseen since the watcher took the lead at the start; n1's beats were read in time
    assert lost == {"n2": START + 11}
