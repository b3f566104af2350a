"""Rule 11, measured: KAI's oscillation example with and without a usage half-life.

    .venv/bin/python -m bench.time_aware [--plot docs/time-aware-oscillation.png]

Two projects of equal weight share 16 GPUs and each always has 16-GPU jobs waiting
(bench/scenarios/oscillation.yaml: 36 one-hour jobs each, a's submitted first, a day of
virtual time). The scenario runs on the core engine (`simulation.trace.scenario`, what
`fairlane simulate --scenario` runs) without a half-life, with k = 0, and with half-lives of
1h, 2h and 6h; for each, the GPU-hours each project held over the day, its part, how many
times the pool changed hands, and the preemptions. The plot shows who held the pool over
time without a half-life and with 2h.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from simulation.trace.scenario import ScenarioOutcome, run_scenario

SCENARIO = Path(__file__).parent / "scenarios" / "oscillation.yaml"
RUNS: tuple[tuple[str, tuple[float | None, float] | None], ...] = (
    ("no half-life", None),
    ("half-life 2h, k 0", (7200.0, 0.0)),
    ("half-life 1h, k 1", (3600.0, 1.0)),
    ("half-life 2h, k 1", (7200.0, 1.0)),
    ("half-life 6h, k 1", (21600.0, 1.0)),
)


def handovers(outcome: ScenarioOutcome) -> int:
    held = outcome.allocation.gpus.get("a", [])
    return sum(1 for before, after in itertools.pairwise(held) if before != after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plot", type=Path, help="write the allocation plot here (PNG)")
    args = parser.parse_args()
    outcomes = {label: run_scenario(SCENARIO, usage) for label, usage in RUNS}
    print(f"{'run':<20} {'a GPU-h':>8} {'b GPU-h':>8} {'a part':>7} {'turns':>6} {'preempt':>8}")
    for label, outcome in outcomes.items():
        a, b = outcome.gpu_hours.get("a", 0.0), outcome.gpu_hours.get("b", 0.0)
        print(
            f"{label:<20} {a:>8.1f} {b:>8.1f} {a / (a + b):>7.1%} {handovers(outcome):>6} "
            f"{outcome.summary.preemptions:>8}"
        )
    if args.plot is not None:
        plot(outcomes["no half-life"], outcomes["half-life 2h, k 1"], args.plot)
        print(f"plot: {args.plot}")


def plot(off: ScenarioOutcome, on: ScenarioOutcome, path: Path) -> None:
    # imported here: matplotlib is slow to import, and only the plot needs it
    import numpy as np  # noqa: PLC0415
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1, sharex=True)
    for ax, outcome, title in (
        (axes[0], off, "without a usage half-life: the older project a wins every time"),
        (axes[1], on, "usage half-life 2h, k 1 (rule 11): a and b take turns"),
    ):
        a = outcome.allocation
        end = outcome.end_s
        for project, values in sorted(a.gpus.items()):
            t = np.append(np.asarray(a.time), end) / 3600.0
            v = np.append(np.asarray(values, dtype=float), values[-1])
            hours = outcome.gpu_hours.get(project, 0.0)
            ax.step(t, v, where="post", linewidth=1.0, label=f"{project}: {hours:.0f} GPU-h")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("GPUs held")
        ax.set_ylim(-0.5, 17)
        ax.grid(alpha=0.3)
        ax.legend(loc="center right", fontsize=8)
    axes[1].set_xlabel("time (hours)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
