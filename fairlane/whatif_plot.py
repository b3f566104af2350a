"""The what-if plot: each figure of the two runs as a pair of bars, and their JCT CDFs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def write_comparison(
    values_by_run: dict[str, dict[str, Any]],
    jct_by_run: dict[str, list[float]],
    shown: list[tuple[str, str]],
    out: Path,
) -> Path:
    """Bars for each (label, key) of `shown` per run, then the runs' JCT CDFs: whatif.png."""
    out.mkdir(parents=True, exist_ok=True)
    columns = 4
    rows = (len(shown) + 1 + columns - 1) // columns
    # a Figure on the Agg canvas, not pyplot: nothing global is touched (as simulation/trace)
    fig = Figure(figsize=(4 * columns, 3 * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False)
    labels = list(values_by_run)
    values = list(values_by_run.values())
    for ax, (label, attr) in zip(axes.flat, shown, strict=False):
        heights = [v[attr] if v[attr] is not None else 0.0 for v in values]
        ax.bar(labels, heights, color=["tab:blue", "tab:orange"])
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=8)
    cdf = axes.flat[len(shown)]
    for label, jct in jct_by_run.items():
        if jct:
            ordered = np.sort(np.asarray(jct))
            cdf.step(
                ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post", label=label
            )
    cdf.set_title("job completion time CDF (s)", fontsize=9)
    cdf.legend(fontsize=8)
    for ax in list(axes.flat)[len(shown) + 1 :]:
        ax.axis("off")
    fig.tight_layout()
    path = out / "whatif.png"
    fig.savefig(path, dpi=100)
    return path
