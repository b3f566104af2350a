"""`--engine in-process`: a scenario on the services' own code in one process, on the
in-memory log and a virtual clock (`simulation/scenario/in_process.py`).

Steps become the commands a user would send, as on the live engine; each node is a real node
executor whose replicas do the scenario's simulated work (`duration`, `checkpoint`) on the
virtual clock, so `advance` runs here too and every scenario of the suite, and of its anchors,
runs on the services. `complete` and `fail` end a job's replicas with exit 0 or 1, and
`remove_node` stops the node's executor until the node watcher declares the node lost.
"""

from __future__ import annotations

from events import Event
from events.commands import AnyCommand, HoldScheduling, SetPool, SubmitJob
from services.runtime.eventlog import Stored
from simulation.scenario.core_engine import unsettled_on_a_copy
from simulation.scenario.in_process import InProcessCluster
from simulation.scenario.observe import Observation, observe
from simulation.scenario.setup import (
    JOB_COMMANDS,
    Projects,
    SetupRefused,
    node_command,
    pool_commands,
)
from simulation.spec import ProjectEntry, Scenario, Step, compute_pool_of


class InProcessEngine:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.pools = [p.name for p in scenario.pools]
        self.compute_pool = compute_pool_of(scenario)
        self.projects = Projects(self.compute_pool)
        self.cluster = InProcessCluster()
        self.events: list[Event] = []

    async def start(self) -> None:
        await self.cluster.start(self._collect)
        await self._configure(self.scenario.config)
        for pool, command in zip(self.scenario.pools, pool_commands(self.scenario), strict=True):
            await self._configure(command)
            for node in pool.nodes:
                await self.cluster.add_node(node.name, pool.name, node.gpus)
        for project in self.scenario.projects:
            await self._set_project(project)
        await self.cluster.settle()

    async def stop(self) -> None:
        await self.cluster.stop()

    async def _collect(self, stored: Stored) -> None:
        self.events.append(stored.event)

    async def _configure(self, command: AnyCommand) -> None:
        reply = await self.cluster.command(command)
        if not reply.ok:
            raise SetupRefused(f"{type(command).__name__} refused: {reply.error}")

    async def _set_project(self, entry: ProjectEntry) -> None:
        for command in self.projects.set(entry, self.pools):
            await self._configure(command)

    async def step(self, step: Step) -> None:
        cluster = self.cluster
        match step.kind:
            case "submit":  # all of the batch lands before the policy looks, as on core
                await cluster.command(HoldScheduling(held=True, reason=f"step {step.number}"))
                for job in step.value:
                    cluster.work.submitted(job.id, job.spec)
                    await cluster.command(SubmitJob(job_id=job.id, spec=job.spec))
                await cluster.command(HoldScheduling(held=False, reason=f"step {step.number}"))
            case "complete" | "fail":
                for job_id in step.value:
                    cluster.finish(job_id, ok=step.kind == "complete")
            case "cancel" | "pause" | "resume":  # a refusal changes nothing, as on core
                for job_id in step.value:
                    await cluster.command(JOB_COMMANDS[step.kind](job_id=job_id))
            case "set_project":
                await self._set_project(step.value)
            case "add_node":
                if step.value.pool not in self.pools:
                    self.pools.append(step.value.pool)
                    await self._configure(SetPool(pool=step.value.pool))
                node = step.value
                await cluster.add_node(node.name, node.pool, node.gpus)
            case "remove_node":
                await cluster.lose(step.value)
            case "cordon" | "drain" | "uncordon":  # a lost node's refusal: as on core
                await cluster.command(node_command(step.kind, step.value))
            case "advance":
                await cluster.advance(step.value)
        await cluster.settle()

    def observe(self) -> Observation:
        state, now = self.cluster.observer.state, self.cluster.clock.now()
        seen = observe(state, self.events, now, self.compute_pool)
        seen.unsettled = self._unsettled
        return seen

    def _unsettled(self) -> str:
        return unsettled_on_a_copy(self.cluster.observer.state, self.cluster.clock.now())
