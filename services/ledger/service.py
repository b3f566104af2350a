"""The quota ledger service.

Configuration commands become `ProjectConfigured` / `PoolConfigured` / `VolumesConfigured`
(the host folders jobs may mount) events carrying the complete result (a change names only
what changes; the event names everything, so replay needs no history). From the log it keeps
each project's usage per pool and records `ProjectQuotaCrossed` when a project goes over its
quota or back within it. What it recorded before is read back from the log, so a restarted
ledger does not announce old crossings again.
"""

from __future__ import annotations

from events import NodeLost, ProjectQuotaCrossed, ids
from events.commands import LEDGER_COMMANDS, LEDGER_SUBJECT, AnyCommand, Reply
from policy.commands.outcome import refuse
from policy.usage import Usage
from services.runtime.clock import WALL_CLOCK, Clock
from services.runtime.commands import CommandRefused, carry_out
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.host import Host, nats_host
from services.runtime.snapshots import EVERY_EVENTS, Snapshotter

SERVICE = "ledger"


class Ledger:
    def __init__(
        self,
        log: EventLog,
        snapshot_every: int = EVERY_EVENTS,
        clock: Clock = WALL_CLOCK,
        host: Host | None = None,
    ) -> None:
        self.log = log
        self.clock = clock
        self.host = host or nats_host(log)
        # the ledger takes the snapshots every decision service restarts from (see snapshots.py)
        store = self.host.snapshots()
        snapshotter = None if store is None else Snapshotter(store, every=snapshot_every)
        self.follower = Follower(log, snapshotter=snapshotter, service=SERVICE)
        self.over: dict[tuple[str, str], bool] = {}  # as last recorded in the log
        self.usage = Usage()
        self.live = False

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up(self._observe)
        self.live = True
        await self.host.serve(LEDGER_SUBJECT, self.handle)
        await self.follower.run(self._observe)

    async def handle(self, command: AnyCommand) -> Reply:
        if not isinstance(command, LEDGER_COMMANDS):
            kind = type(command).__name__
            raise CommandRefused(refuse("not_taken_here", None, kind, service="the ledger"))
        return await carry_out(self.log, self.follower, command, self.clock.now())

    async def _observe(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, ProjectQuotaCrossed):
            self.over[(event.project, event.pool)] = event.over
            return
        state = self.follower.state
        job = state.jobs.get(getattr(event, "job_id", None) or "")
        if job is not None:
            self.usage.job_changed(job)
            projects = [job.project]
        elif isinstance(event, NodeLost):
            self.usage.recount(state)
            projects = list(state.projects)
        else:
            project = getattr(event, "project", None)
            projects = [project] if project else []
        if not self.live:
            return
        for project in projects:
            if project in state.projects:
                await self._check_quota(project, event.id, stored.seq)

    async def _check_quota(self, project: str, cause: str, seq: int) -> None:
        for pool, terms in self.follower.state.projects[project].terms.items():
            usage = self.usage.of(project, pool)
            now_over = usage > terms.quota
            if self.over.get((project, pool), False) != now_over:
                self.over[(project, pool)] = now_over
                await self.log.publish_durably(
                    ProjectQuotaCrossed(
                        id=ids.quota_crossed(project, pool, seq),
                        time=self.clock.now(),
                        actor="ledger",
                        causation=cause,
                        project=project,
                        pool=pool,
                        usage=usage,
                        quota=terms.quota,
                        over=now_over,
                    )
                )
