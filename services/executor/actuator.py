"""Carrying the planner's actions out, and turning what happens back into facts.

The actuator owns this node's side effects: the runtime (processes, containers, hollow), the
cluster's checkpoint store and the workloads' output (both through the host), the log and the
workloads' endpoint. `act` records each action in the facts at once (a replica starting, a
stop sent, a report in flight), so the next plan does not ask for it again, and runs what
waits in tasks of its own; each task ends in an observation (a replica ended, a checkpoint
stored, a report in the log, a grace period over) that updates the facts and sets `changed`,
on which the executor plans again. Time comes from the injected clock.

This module is the dispatch and the reports; the rest is one idea a module, each keeping its
facts in the `Inventory` (`inventory.py`): `starting` (launch, checkpoint fetched, ports checked),
`watching` (signals, exits, output), `checkpointing` (saves seen, stored, fetched) and
`takeup` (what a restart finds).
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Set
from pathlib import Path

import msgspec

from events import NODE_REPORTS, Event, ids
from services.executor.checkpointing import Checkpointing
from services.executor.config import ExecutorConfig
from services.executor.facts import (
    AttemptFacts,
    AttemptKey,
    Closing,
    Here,
    ReplicaOrder,
    replica_order,
)
from services.executor.inventory import Inventory
from services.executor.nodework import NodeWork, desired
from services.executor.plan import (
    KILL_WAIT_S,
    Action,
    Counted,
    Forget,
    Kill,
    Register,
    Report,
    ShutdownReported,
    Start,
    Store,
    Terminate,
)
from services.executor.runtime import ProcessRecord, Runtime
from services.executor.sampling import UsageTracker
from services.executor.shutdown import StoppedAttempt, forget_stopped, write_stopped
from services.executor.starting import Starting
from services.executor.storage import ObjectCheckpoints
from services.executor.takeup import TakingUp
from services.executor.watching import Watching
from services.runtime.clock import Clock
from services.runtime.eventlog import EventLog
from services.runtime.host import Host


class Actuator:
    def __init__(
        self,
        host: Host,
        config: ExecutorConfig,
        runtime: Runtime,
        clock: Clock,
        usage: UsageTracker,
    ) -> None:
        self.log: EventLog = host.log
        self.host, self.config = host, config
        self.runtime, self.clock, self.usage = runtime, clock, usage
        self.node = config.node
        self.inventory = inventory = Inventory(config, runtime, clock)
        self.data_dir = inventory.data_dir
        storage = config.checkpoint_storage
        self.checkpointing = Checkpointing(
            inventory,
            ObjectCheckpoints(host.checkpoints(), storage.max_bytes)
            if storage.kind == "object_store" and runtime.saves
            else None,
        )
        self.watching = Watching(inventory, host, self.checkpointing)
        self.starting = Starting(inventory, self.checkpointing, self.watching)
        self.taking_up = TakingUp(inventory, self.starting)
        # the inventory's, named here for the executor, its endpoint and the engines
        self.replicas, self.attempts, self.handles = (
            inventory.replicas,
            inventory.attempts,
            inventory.handles,
        )
        self.started, self.stale = inventory.started, inventory.stale
        self.changed, self.tasks, self.logger = inventory.changed, inventory.tasks, inventory.logger
        self.held_gpus, self.by_token = inventory.held_gpus, inventory.by_token
        self.look_all, self.saved = self.checkpointing.look_all, self.checkpointing.saved
        # the reports made, and the node's state
        self.reported: set[str] = set()
        self.published: set[str] = set()
        self.failed: set[str] = set()  # reports given up on
        #: per job, the ids of its reports made here, until it is done with this node
        #: (`forget_reports`)
        self.reports_of: dict[str, list[str]] = {}
        self.shut: dict[tuple[str, int], float] = {}
        self.closing: Closing = ""
        self.lost = False
        self.registrations = 0
        # made from the facts for a plan, and kept for the next while those did not change:
        # made for every replica and attempt here at every plan, they grew with the node
        # (docs/executor.md has the figures)
        self._order: tuple[int, ReplicaOrder] | None = None
        self._attempts_used: tuple[tuple[int, int], dict[AttemptKey, AttemptFacts]] | None = None
        self._here: tuple[tuple[object, ...], Here] | None = None

    @property
    def objects(self) -> ObjectCheckpoints | None:
        return self.checkpointing.objects

    @property
    def endpoint_path(self) -> Path | None:
        return self.starting.endpoint_path

    @endpoint_path.setter
    def endpoint_path(self, path: Path | None) -> None:
        self.starting.endpoint_path = path

    def here(self, offer: Event | None = None) -> Here:
        """The facts, as the planner reads them: this actuator's own mappings, not copies (a
        plan runs after every change, and only reads them before anything acts on it). The
        last one again while nothing it was made from changed (its sets and `shut` are these
        same objects, whatever they hold now)."""
        stamp = (
            self.inventory.replica_changes,
            self.inventory.attempt_changes,
            self.usage.changes,
            self.closing,
            self.lost,
            self.registrations,
            offer,
        )
        if self._here is not None and self._here[0] == stamp and self._here[1].shut is self.shut:
            return self._here[1]
        here = Here(
            node=self.node,
            actor=self.config.actor,
            boot_id=self.config.boot_id,
            saves=self.runtime.saves,
            objects=self.objects is not None,
            attempts=self._attempts_with_usage(),
            replicas=self.replicas,
            reported=self.reported,
            published=self.published,
            shut=self.shut,
            closing=self.closing,
            lost=self.lost,
            registrations=self.registrations,
            offer=offer,  # type: ignore[arg-type]
            order=self._replica_order(),
        )
        self._here = (stamp, here)
        return here

    def _replica_order(self) -> ReplicaOrder:
        changes = self.inventory.replica_changes
        if self._order is None or self._order[0] != changes:
            self._order = (changes, replica_order(self.replicas))
        return self._order[1]

    def _attempts_with_usage(self) -> dict[AttemptKey, AttemptFacts]:
        """Each attempt's facts with its GPUs' mean use as sampled now."""
        changes = (self.inventory.attempt_changes, self.usage.changes)
        if self._attempts_used is None or self._attempts_used[0] != changes:
            attempts = {k: self._with_usage(k, a) for k, a in self.attempts.items()}
            self._attempts_used = (changes, attempts)
        return self._attempts_used[1]

    def _with_usage(self, key: AttemptKey, facts: AttemptFacts) -> AttemptFacts:
        """The attempt's facts with its GPUs' mean use as sampled now (made anew only when that
        changed: a plan runs after every change here, a sample comes every few seconds)."""
        average = self.usage.average(key)
        if average == facts.utilization:
            return facts
        return dataclasses.replace(facts, utilization=average)

    # -- acting ----------------------------------------------------------------------------------

    def act(self, actions: list[Action]) -> None:
        inventory = self.inventory
        for action in actions:
            match action:
                case Start():
                    self.starting.start(action)
                case Terminate(key=key, grace_s=grace):
                    self.watching.signal(key, signal.SIGTERM, stop_at=self.clock.now())
                    inventory.spawn(inventory.wake(key[0], grace))
                case Kill(key=key):
                    self.logger.warning("grace period over: SIGKILL", replica=key[:2])
                    self.watching.signal(key, signal.SIGKILL, killed=True)
                    inventory.spawn(inventory.wake(key[0], KILL_WAIT_S))
                case Store(key=key, after_stop=after):
                    inventory.set(key, storing=True)
                    inventory.spawn(self.checkpointing.store(key, after))
                case Forget(key=key):
                    inventory.forget(key)
                case Counted(key=key, checkpoints=n, last=last):
                    self.logger.info("checkpoint", job=key[0], attempt=key[1], n=n)
                    inventory.set_attempt(key, checkpoints=n, last_checkpoint=last)
                case _:
                    self._node_action(action)

    def _node_action(self, action: Action) -> None:
        """The actions of reports and of the node itself."""
        match action:
            case Report(event=event, within=within):
                self.reported.add(event.id)
                job_id = _job_of(event)
                if job_id is not None:
                    self.reports_of.setdefault(job_id, []).append(event.id)
                self.inventory.spawn(self._publish(event, within))
            case Register(event=event):
                self.lost, self.registrations = False, self.registrations + 1
                self.inventory.touch(None)  # back in service: every job may start again
                self.reported.add(event.id)
                self.inventory.spawn(self._publish(event, 300.0))
            case ShutdownReported():
                self.shut = {}
                self.inventory.touch(None)
                if self.runtime.real:
                    forget_stopped(self.data_dir)

    # -- the log ---------------------------------------------------------------------------------

    async def publish(self, event: Event, give_up_after: float = 300.0) -> None:
        """Publish until stored: ids are deterministic, so a retry is never a duplicate. A
        report of an attempt here names this node: the server takes one only on this node's
        subject, and the fold only from a node the attempt has a replica on."""
        if isinstance(event, NODE_REPORTS) and event.node is None:
            event = msgspec.structs.replace(event, node=self.node)
        await self.log.publish_durably(event, give_up_after=give_up_after)

    async def _publish(self, event: Event, within: float) -> None:
        try:
            await self.publish(event, give_up_after=within)
        except Exception as e:  # given up: it stays in `reported`, never asked for again
            self.logger.error("not reported", id=event.id, error=str(e) or repr(e))
            self.failed.add(event.id)
            self.inventory.touch(_job_of(event))
            return
        self.published.add(event.id)
        job_id, attempt = getattr(event, "job_id", None), getattr(event, "attempt", None)
        if isinstance(job_id, str) and isinstance(attempt, int):
            if event.id == ids.started(job_id, attempt) and (job_id, attempt) in self.started:
                self.started[(job_id, attempt)].set()
        self.inventory.touch(_job_of(event))

    # -- after a restart, and closing ------------------------------------------------------------

    def take_up(self, work: NodeWork, found: list[ProcessRecord]) -> None:
        """What an earlier run of this executor left (see `takeup`)."""
        self.shut.update(self.taking_up.take_up(work, found))

    def shut_down(self, work: NodeWork) -> None:
        """A shut down: every attempt the log wants running here, and no stop covers, is to be
        stopped and reported; the file names them first."""
        now = self.clock.now()
        keys = sorted(
            {
                r.attempt_key
                for r in self.replicas.values()
                if not r.ended
                and r.stop_at is None
                and desired(work.jobs.get(r.job_id), r.attempt, r.replica)
                and not work.stops_of(r.job_id)
            }
        )
        self.shut.update({k: now for k in keys})
        if keys and self.runtime.real:  # a hollow replica leaves nothing to find
            write_stopped(self.data_dir, [StoppedAttempt(k[0], k[1], now) for k in keys])
        if keys:
            self.logger.info("shutting down: stopping the jobs here", jobs=[k[0] for k in keys])
        self.closing = "shutdown"
        self.inventory.touch(None)

    def forget_reports(self, work: NodeWork, jobs: Set[str] | None) -> None:
        """Drop the report ids of these jobs (None: of every job) that are done with this node:
        none of their replicas is here in the log or on the machine, nor stopped for a shut
        down, and none of their reports is still being published. Every report is asked about
        only for a job with work or replicas here, so none of those ids is asked about again;
        kept, they grew with every job the node ever ran."""
        for job_id in list(self.reports_of) if jobs is None else jobs:
            made = self.reports_of.get(job_id)
            if made is None or job_id in work.jobs or self._still_here(job_id):
                continue
            if any(i not in self.published and i not in self.failed for i in made):
                continue  # being published: `busy` counts it until it is
            del self.reports_of[job_id]
            self.reported.difference_update(made)
            self.published.difference_update(made)
            self.failed.difference_update(made)

    def _still_here(self, job_id: str) -> bool:
        """Does this node still know an attempt of the job (running, stopping, or stopped for
        a shut down)?"""
        return any(
            key[0] == job_id for keys in (self.attempts, self.replicas, self.shut) for key in keys
        )

    def busy(self) -> bool:
        """Whether anything started here still runs, or a store or a report is in flight."""
        running = any(not r.ended for r in self.replicas.values())
        storing = any(r.storing for r in self.replicas.values())
        return running or storing or bool(self.reported - self.published - self.failed)


def _job_of(event: Event) -> str | None:
    """The job a report is of (None for the node's own, such as its registration)."""
    job_id = getattr(event, "job_id", None)
    return job_id if isinstance(job_id, str) else None
