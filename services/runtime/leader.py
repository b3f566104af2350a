"""The fenced leader: one writer per decision kind, written once for every service that leads.

A candidate waits on the kind's lease; once it holds it, it records its term (`LeaderElected`
on `fl.leader.<kind>`) and leads, keeping the lease, with every write fenced on that term
(`Term.fence`): if a newer leader records its term meanwhile, the server refuses the old
leader's write (`Conflict`), and the old leader steps down and stands by again. The scheduler
and the preemptor (services/runtime/decider.py) and the node watcher all lead through this.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from events import LeaderElected
from services.runtime.clock import Clock
from services.runtime.eventlog import Conflict, EventLog
from services.runtime.host import Host
from services.runtime.retry import is_transient
from services.runtime.tasks import cancel_and_wait

log = structlog.get_logger("fairlane.leader")
#: How long to wait after the server went away before standing for the lease again.
RETRY_S = 0.5


@dataclass(frozen=True)
class Term:
    """One stretch of leading: its number, the fence every write of it carries, and `lost`,
    set when the lease is lost (leading must end then)."""

    number: int
    fence: tuple[str, int]
    lost: asyncio.Event


Lead = Callable[[Term], Awaitable[None]]


class FencedLeader:
    def __init__(self, event_log: EventLog, host: Host, kind: str, clock: Clock, ttl_s: float):
        self.log = event_log
        self.kind = kind
        self.clock = clock
        self.holder = f"{kind}-{uuid.uuid4().hex[:8]}"
        self.lease = host.leadership(kind, self.holder, ttl_s=ttl_s)
        self.is_leader = asyncio.Event()

    async def run(self, lead: Lead) -> None:
        """Stand for the lease and `lead` each term won, for ever (cancel to stop). Passing
        trouble (the server away, the store full) ends a term and is waited out; anything
        else is the service's failure and is raised."""
        try:
            while True:
                try:
                    await self.lease.acquire()
                    await self._term(lead)
                except Exception as e:
                    if not is_transient(e):
                        raise
                    log.warning("term interrupted", kind=self.kind, error=str(e) or repr(e))
                    await asyncio.sleep(RETRY_S)
        finally:
            await self.lease.release()

    async def _term(self, lead: Lead) -> None:
        number = self.lease.revision or 0
        elected = LeaderElected(
            id=f"{self.kind}/term/{self.holder}/{number}",
            time=self.clock.now(),
            actor=self.holder,
            kind=self.kind,
            holder=self.holder,
            term=number,
        )
        fence = (f"fl.leader.{self.kind}", await self.log.publish_durably(elected))
        term = Term(number, fence, asyncio.Event())
        keeping = asyncio.create_task(self.lease.keep(term.lost))
        self.is_leader.set()
        log.info("leading", kind=self.kind, holder=self.holder, term=number)
        try:
            await lead(term)
        except Conflict:
            log.warning("deposed: a newer term fenced our write", kind=self.kind)
        finally:
            self.is_leader.clear()
            await cancel_and_wait(keeping)
