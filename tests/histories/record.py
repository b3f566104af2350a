"""Record a scenario's run on the live engine (real services on a nats-server) as an export.

    .venv/bin/python -m tests.histories.record scenarios/NAME.yaml tests/histories/NAME.jsonl
    .venv/bin/python -m tests.histories.record   # every history again, from its scenario

The file is the stream as the services left it, every event with its sequence, in the format
of `fairlane log export`: the histories the audit tests replay. Record them again whenever the
policy decides differently (and raise `policy.version.POLICY_VERSION`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from events.export import export_line
from simulation.scenario.live_engine import LiveEngine, start_process_executor
from simulation.spec import load_scenario


async def record(scenario_path: Path, out: Path) -> int:
    scenario = load_scenario(scenario_path)
    engine = LiveEngine(scenario, start_process_executor)
    try:
        await engine.start()
        for step in scenario.steps:
            if step.kind != "expect":
                await engine.step(step)
        await engine.settle()
        lines = [export_line(s.seq, s.event) async for s in engine.client.read(1)]
    finally:
        await engine.stop()
    out.write_bytes(b"".join(lines))
    return len(lines)


HERE = Path(__file__).parent
SCENARIOS = HERE.parent.parent / "scenarios"


def main(args: list[str]) -> None:
    if len(args) not in (0, 2):
        raise SystemExit(__doc__)
    pairs = [(Path(args[0]), Path(args[1]))] if args else []
    pairs += [(SCENARIOS / f"{p.stem}.yaml", p) for p in sorted(HERE.glob("*.jsonl")) if not args]
    for scenario, out in pairs:
        count = asyncio.run(record(scenario, out))
        print(f"{out}: {count} events")


if __name__ == "__main__":
    main(sys.argv[1:])
