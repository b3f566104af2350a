"""Record a scenario's run on the in-process engine (the services' own code on the in-memory
log, a virtual clock) as an export: for histories that need the virtual clock (`advance`),
which the live engine cannot run, such as rule 11's decay.

    .venv/bin/python -m tests.histories.record_in_process   # every history again

Each `tests/histories/in_process/NAME.jsonl` is the run of `scenarios/NAME.yaml`, in the
format of `fairlane log export`. Record them again whenever the policy decides differently.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from events.export import export_line
from simulation.scenario.in_process_engine import InProcessEngine
from simulation.spec import load_scenario

HERE = Path(__file__).parent / "in_process"
SCENARIOS = Path(__file__).parent.parent.parent / "scenarios"


async def record(scenario_path: Path, out: Path) -> int:
    scenario = load_scenario(scenario_path)
    engine = InProcessEngine(scenario)
    try:
        await engine.start()
        for step in scenario.steps:
            if step.kind != "expect":
                await engine.step(step)
        lines = [export_line(s.seq, s.event) async for s in engine.cluster.log.read(1)]
    finally:
        await engine.stop()
    out.write_bytes(b"".join(lines))
    return len(lines)


def main(args: list[str]) -> None:
    names = args or [p.stem for p in sorted(HERE.glob("*.jsonl"))]
    for name in names:
        out = HERE / f"{name}.jsonl"
        count = asyncio.run(record(SCENARIOS / f"{name}.yaml", out))
        print(f"{out}: {count} events")


if __name__ == "__main__":
    main(sys.argv[1:])
