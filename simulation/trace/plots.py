"""PNG plots of a run: waiting jobs and GPU utilization over time, and the CDF of JCTs.

Drawn on matplotlib `Figure`s with the Agg canvas, never through pyplot, so nothing global
(a display backend, open figures) is touched. Series are step functions; each plot shows their
time-weighted mean over at most `BINS` equal bins, which is exact for the area under the curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulation.trace.metrics import Series

BINS = 800


@dataclass(frozen=True)
class Curves:
    """What the plots show of a run."""

    series: Series
    jct_s: list[float]
    capacity: int  # GPUs: utilization is busy GPUs over this
    end_s: float


def write_plots(curves: Curves, out: Path, title: str) -> list[Path]:
    series, jct_s, capacity, end_s = curves.series, curves.jct_s, curves.capacity, curves.end_s
    out.mkdir(parents=True, exist_ok=True)
    unit, scale = ("days", 86400.0) if end_s > 2 * 86400 else ("hours", 3600.0)
    edges, busy = binned(series.time, series.busy_gpus, end_s)
    _, waiting = binned(series.time, series.waiting_jobs, end_s)
    x = edges[:-1] / scale
    paths = [out / "utilization.png", out / "queue.png", out / "jct_cdf.png"]

    fig, ax = _figure(title, f"time ({unit})", "GPU utilization")
    ax.step(x, busy / capacity if capacity else busy, where="post", linewidth=0.8)
    ax.set_ylim(0, 1.05)
    _save(fig, paths[0])

    fig, ax = _figure(title, f"time ({unit})", "jobs waiting for GPUs")
    ax.step(x, waiting, where="post", linewidth=0.8, color="tab:orange")
    _save(fig, paths[1])

    fig, ax = _figure(title, "job completion time (hours)", "fraction of jobs")
    if jct_s:
        ordered = np.sort(np.asarray(jct_s)) / 3600.0
        ax.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post")
        if ordered[0] > 0:
            ax.set_xscale("log")
    ax.set_ylim(0, 1.0)
    _save(fig, paths[2])
    return paths


def binned(
    times: list[float], values: list[int], end: float, bins: int = BINS
) -> tuple[np.ndarray, np.ndarray]:
    """Bin edges and the time-weighted mean of a step function in each bin, up to `end`."""
    if not times or end <= times[0]:
        return np.array([0.0, max(end, 1.0)]), np.zeros(1)
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    knots = np.append(t, max(end, t[-1]))
    area = np.concatenate(([0.0], np.cumsum(v * np.diff(knots))))
    edges = np.linspace(t[0], knots[-1], bins + 1)
    mean = np.diff(np.interp(edges, knots, area)) / np.diff(edges)
    return edges, mean


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(8, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax: Axes = fig.subplots()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=120)


def write_allocation(
    times: list[float], gpus: dict[str, list[int]], end_s: float, path: Path, title: str
) -> Path:
    """Each project's GPUs over time (a step function per project) as one PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    unit, scale = ("days", 86400.0) if end_s > 2 * 86400 else ("hours", 3600.0)
    fig, ax = _figure(title, f"time ({unit})", "GPUs held")
    for project, values in gpus.items():
        t = np.append(np.asarray(times, dtype=float), max(end_s, times[-1] if times else 0.0))
        v = np.append(np.asarray(values, dtype=float), values[-1] if values else 0.0)
        ax.step(t / scale, v, where="post", linewidth=1.0, label=project)
    if gpus:
        ax.legend(loc="upper right", fontsize=8)
    _save(fig, path)
    return path
