"""`--engine core`: a scenario on the pure policy with simulated executors and a virtual clock."""

from __future__ import annotations

import copy

from events.commands import AnyCommand
from policy.commands import Refused
from policy.state import ClusterState
from simulation.scenario.observe import Observation, holdings, observe, what_changed
from simulation.scenario.setup import (
    JOB_COMMANDS,
    Projects,
    SetupRefused,
    node_command,
    pool_commands,
)
from simulation.spec import ProjectEntry, Scenario, Step, compute_pool_of
from simulation.virtual_cluster import VirtualCluster

#: How long `stable` runs the system on, in virtual time, with no job finishing.
STABLE_HORIZON_S = 3600.0


def unsettled_on_a_copy(state: ClusterState, now: float) -> str:
    """What `stable` sees on engines whose services folded `state` on a virtual clock, judged
    as the core engine judges its own: on a copy, more cycles, then an hour with no job
    finishing. "" when nothing changes."""
    probe = VirtualCluster(state=copy.deepcopy(state), now=now)
    before = holdings(probe.state)
    probe.settle()
    probe.advance(STABLE_HORIZON_S)
    return what_changed(before, holdings(probe.state), probe.log)


class CoreEngine:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.vc = VirtualCluster()
        self.pools = [p.name for p in scenario.pools]
        self.compute_pool = compute_pool_of(scenario)
        self.projects = Projects(self.compute_pool)
        self._configure(scenario.config)
        for pool, command in zip(scenario.pools, pool_commands(scenario), strict=True):
            self._configure(command)
            for node in pool.nodes:
                self.vc.add_node(node.name, pool.name, node.gpus)
        for project in scenario.projects:
            self._set_project(project)
        self.vc.settle()

    def _configure(self, command: AnyCommand) -> None:
        outcome = self.vc.command(command)
        if isinstance(outcome, Refused):
            raise SetupRefused(f"{type(command).__name__} refused: {outcome.reason}")

    def _set_project(self, entry: ProjectEntry) -> None:
        for command in self.projects.set(entry, self.pools):
            self._configure(command)

    def step(self, step: Step) -> None:
        vc = self.vc
        match step.kind:
            case "submit":
                for job in step.value:
                    vc.submit(job.id, job.spec)
            case "complete" | "fail":  # the workload exits: the executor reports it
                report = vc.complete if step.kind == "complete" else vc.fail
                for job_id in step.value:
                    report(job_id)
            case "cancel" | "pause" | "resume":
                for job_id in step.value:
                    vc.command(JOB_COMMANDS[step.kind](job_id=job_id))
            case "set_project":
                self._set_project(step.value)
            case "add_node":
                if step.value.pool not in self.pools:
                    self.pools.append(step.value.pool)
                vc.add_node(step.value.name, step.value.pool, step.value.gpus)
            case "remove_node":
                vc.remove_node(step.value)
            case "cordon" | "drain" | "uncordon":
                vc.command(node_command(step.kind, step.value))
            case "advance":
                vc.advance(step.value)
                return
        vc.settle()

    def observe(self) -> Observation:
        seen = observe(self.vc.state, self.vc.log, self.vc.now, self.compute_pool)
        seen.unsettled = self._unsettled
        return seen

    def _unsettled(self) -> str:
        """Run on a copy: more cycles, then an hour with no job finishing."""
        probe = copy.deepcopy(self.vc)
        probe.observer = None
        probe.work.clear()
        before, start = holdings(probe.state), len(probe.log)
        probe.settle()
        probe.advance(STABLE_HORIZON_S)
        return what_changed(before, holdings(probe.state), probe.log[start:])
