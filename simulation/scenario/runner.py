"""Running scenario files on an engine and collecting verdicts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from simulation.scenario.core_engine import CoreEngine
from simulation.scenario.in_process import InProcessError
from simulation.scenario.in_process_engine import InProcessEngine
from simulation.scenario.live_engine import LiveEngine, LiveError
from simulation.scenario.observe import check
from simulation.scenario.setup import SetupRefused
from simulation.spec import Scenario, ScenarioError, load_scenario
from simulation.virtual_cluster import NotSettled

Grade = Literal["pass", "fail", "skip", "error"]
#: core: the pure policy; live: the services on nats-server, with real workloads on the wall
#: clock or simulated ones on a virtual clock (as the scenario needs); in-process: the services
#: in one process on the in-memory log and a virtual clock. Every scenario runs on each.
EngineName = Literal["core", "live", "in-process"]


@dataclass
class Result:
    path: str
    name: str
    verdict: Grade
    expectations: int = 0
    problems: list[str] = field(default_factory=list)
    reason: str = ""  # why it was skipped, or the error


def run_file(path: Path, engine: EngineName = "core") -> Result:
    try:
        scenario = load_scenario(path)
    except ScenarioError as e:
        return Result(str(path), path.stem, "error", reason=str(e))
    return run_scenario(scenario, engine)


def run_scenario(scenario: Scenario, engine: EngineName = "core") -> Result:
    result = Result(str(scenario.path), scenario.name, "pass")
    if engine == "live":
        return asyncio.run(_run_live(scenario, result))
    if engine == "in-process":
        return asyncio.run(_run_in_process(scenario, result))
    try:
        runner = CoreEngine(scenario)
        for step in scenario.steps:
            if step.kind == "expect":
                result.expectations += 1
                for problem in check(step.value, runner.observe()):
                    result.problems.append(f"step {step.number} expect {problem}")
            else:
                runner.step(step)
    except NotSettled as e:
        result.verdict, result.reason = "error", str(e)
        return result
    if result.problems:
        result.verdict = "fail"
    return result


async def _run_live(scenario: Scenario, result: Result) -> Result:
    engine = LiveEngine(scenario)
    try:
        await engine.start()
        for step in scenario.steps:
            if step.kind == "expect":
                result.expectations += 1
                if step.value.stable:
                    await engine.check_stable()
                for problem in check(step.value, engine.observe()):
                    result.problems.append(f"step {step.number} expect {problem}")
            else:
                await engine.step(step)
    except LiveError as e:
        result.verdict, result.reason = "error", str(e)
        return result
    finally:
        await engine.stop()
    if result.problems:
        result.verdict = "fail"
    return result


async def _run_in_process(scenario: Scenario, result: Result) -> Result:
    engine = InProcessEngine(scenario)
    try:
        await engine.start()
        for step in scenario.steps:
            if step.kind == "expect":
                result.expectations += 1
                for problem in check(step.value, engine.observe()):
                    result.problems.append(f"step {step.number} expect {problem}")
            else:
                await engine.step(step)
    except (SetupRefused, InProcessError, TimeoutError) as e:
        result.verdict, result.reason = "error", str(e) or "the services did not settle"
        return result
    finally:
        await engine.stop()
    if result.problems:
        result.verdict = "fail"
    return result
