"""A decision service: a leader that folds the log, runs the policy, and publishes its decisions.

The scheduler (placements) and the preemptor (stop requests and nominations) are the same loop
with a different share of `policy.cycle.decide`'s output. Only the kind's fenced leader
decides (services/runtime/leader.py): every decision is fenced on its term, so if it is
deposed while a write is in flight the server refuses that write. A standby waits on the lease.

Decision ids derive from their inputs, so a new leader that decides the same thing again
publishes duplicates the stream drops.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

from events import Event, JobNominated, JobScheduled
from policy.cycle import decide, next_wakeup
from policy.version import stamped
from services.runtime.clock import WALL_CLOCK, Clock
from services.runtime.eventlog import EventLog
from services.runtime.follower import Follower
from services.runtime.host import Host, nats_host
from services.runtime.leader import FencedLeader, Term
from services.runtime.tasks import while_alive

#: How long to let a burst of events land before deciding on them (at least).
SETTLE_S = 0.005
#: Under load, wait as long as the last cycle took before the next one (up to this much):
#: at most about half the service's time goes to deciding, and each cycle sees more news.
MAX_PACE_S = 0.05
#: Decide at least this often even when nothing happens (clock-driven rules, lost wake-ups).
TICK_S = 1.0
#: How long leadership lasts without a renewal: a standby takes over after about this long.
LEASE_TTL_S = 3.0
#: Decisions in flight at once (acks awaited together: one round trip for many).
PUBLISH_WINDOW = 256


class Decider:
    def __init__(  # noqa: PLR0913 (what it decides, and the parts a test or a process gives it)
        self,
        event_log: EventLog,
        kind: str,
        mine: Callable[[Event], bool],
        clock: Clock = WALL_CLOCK,
        settle_s: float = SETTLE_S,
        host: Host | None = None,
        pace: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.log = event_log
        self.kind = kind
        self.mine = mine
        self.clock = clock
        host = host or nats_host(event_log)
        self.leader = FencedLeader(event_log, host, kind, clock, ttl_s=LEASE_TTL_S)
        self.holder = self.leader.holder
        self.is_leader = self.leader.is_leader
        # a restart (or a standby's start) replays from the newest snapshot the ledger took
        self.follower = Follower(event_log, snapshots=host.snapshots(), service=kind)
        self.settle_s = settle_s
        #: how it waits between cycles: real time here; in one process, until the process is
        #: quiet (simulation/scenario/quiet.py), which is what the pause stands for
        self.pace = pace
        self.last_cycle_s = 0.0
        self.decisions = 0

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up()
        # The replayed state is long-lived: keep the collector from walking it again and again.
        # A cycle pauses the collector while it runs (policy/collector.py); the collections
        # that come due after it, and those while the log is followed, would otherwise walk the
        # whole state (bench.policy_cycle at 4x, before cycles paused it: 244 ms a settled
        # cycle with the collector as it comes, 131 ms with the heap frozen like this).
        gc.collect()
        gc.freeze()
        await while_alive(self.follower.run(), self.leader.run(self._lead), "the follower")

    async def _lead(self, term: Term) -> None:
        await self.follower.wait_for(term.fence[1])
        while not term.lost.is_set():
            published = await self._cycle(term.fence)
            if published:
                await self.follower.wait_for(published)
                await self.pace(min(self.last_cycle_s, MAX_PACE_S))
                continue
            await self._wait_for_change(term.lost)

    async def _cycle(self, fence: tuple[str, int]) -> int:
        """One cycle; returns the sequence of the last decision published (0 if none)."""
        # Placements of different jobs are published side by side, one job's in order (an
        # elastic job's minimum before its extras). Preemption decisions go one by one in the
        # plan's order: a nomination before the stops it causes (the fold applies a stop only
        # for a nomination it applied, and the GPUs must be held for the nominee before any
        # victim lets go of them), and one nomination before a later one that counts on the
        # GPUs its victims give back.
        began = time.perf_counter()
        plan = decide(self.follower.state, self.clock.now())
        decisions = [stamped(e) for e in publishable(plan.events, self.mine)]
        self.last_cycle_s = time.perf_counter() - began
        last = 0
        in_plan_order: list[Event] = []
        per_job: dict[str, list[Event]] = {}
        for event in decisions:
            if isinstance(event, JobScheduled):
                per_job.setdefault(event.job_id, []).append(event)
            else:
                in_plan_order.append(event)

        async def in_order(events: list[Event]) -> int:
            seq = 0
            for event in events:
                seq = await self.log.publish_durably(event, fence=fence)
                self.decisions += 1
            return seq

        if in_plan_order:
            last = await in_order(in_plan_order)
        chains = list(per_job.values())
        for i in range(0, len(chains), PUBLISH_WINDOW):
            window = chains[i : i + PUBLISH_WINDOW]
            last = max([last, *await asyncio.gather(*(in_order(c) for c in window))])
        return last

    async def _wait_for_change(self, lost: asyncio.Event) -> None:
        self.follower.changed.clear()
        now = self.clock.now()
        wake = next_wakeup(self.follower.state, now)
        waits: set[asyncio.Task[object]] = {
            asyncio.create_task(self.follower.changed.wait()),
            asyncio.create_task(lost.wait()),
        }
        if wake is not None:
            # a rule's moment (a preemption_delay, a min_runtime running out) comes on the
            # clock the decisions are made on, which a test may move by hand; the tick is
            # only a safety net, on the event loop's clock
            waits.add(asyncio.create_task(self.clock.sleep(max(0.0, wake - now))))
        try:
            await asyncio.wait(waits, timeout=TICK_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        await self.pace(max(self.settle_s, min(self.last_cycle_s, MAX_PACE_S)))


def publishable(plan: list[Event], mine: Callable[[Event], bool]) -> list[Event]:
    """This decider's share of the plan, up to the first decision that counts on another
    decider's share of it: a nomination of a job the plan also places. A job that starts on
    the GPUs held for it takes part in the same cycle's turns for its extras (rule 6), which may
    nominate it again; the fold holds GPUs for a job only while none are held for it, so that
    nomination, landing before the other decider's placement, was refused, and the same
    decision made again once the placement had landed had the same id, which the stream then
    dropped as a duplicate: the services never got past it. It, and the preemption decisions
    after it (a later nomination may count on the GPUs its victims give back), wait for the
    next cycle, when the placement has landed."""
    placed_by_others = {e.job_id for e in plan if isinstance(e, JobScheduled) and not mine(e)}
    found: list[Event] = []
    for event in plan:
        if not mine(event):
            continue
        if isinstance(event, JobNominated) and event.job_id in placed_by_others:
            break
        found.append(event)
    return found
