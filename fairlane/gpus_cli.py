"""What the GPUs are doing, for `fairlane nodes`, `fairlane list` and `fairlane top`: read
from `GET /v1/gpus` (the executors' latest NVML samples). A reading NVML could not give is
"unknown", never 0; an API without the route (an older cluster) leaves everything unknown."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from fairlane.client import Api, CliError
from fairlane.output import console

UNKNOWN = "unknown"


def report(api: Api) -> dict[str, Any]:
    """The API's GPU report, or an empty one where the API has none to give."""
    try:
        found: dict[str, Any] = api.get("/v1/gpus")
    except CliError:
        return {"nodes": [], "jobs": []}
    return found


def percent(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f}%"


def memory(used: int | None, total: int | None) -> str:
    if used is None or total is None:
        return UNKNOWN
    return f"{used / 1024:.1f}/{total / 1024:.0f} GiB"


def node_utilization(node: dict[str, Any]) -> float | None:
    """The mean of a node's GPUs' utilization; None if any is unknown (or it has none)."""
    values: list[float | None] = [d.get("utilization") for d in node["devices"]]
    known = [v for v in values if v is not None]
    if not values or len(known) < len(values):
        return None
    return sum(known) / len(known)


def with_gpus(nodes: list[dict[str, Any]], gpus: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node of `/v1/nodes` with its GPUs' readings (`devices`), their `source`, when they
    were sampled and the jobs on it."""
    by_node = {n["node"]: n for n in gpus["nodes"]}
    merged = []
    for n in nodes:
        g = by_node.get(n["node"], {})
        merged.append({
            **n,
            "source": g.get("source", UNKNOWN),
            "error": g.get("error", ""),
            "sampled_at": g.get("sampled_at"),
            "devices": g.get("devices", [{"index": i} for i in range(n["gpus"])]),
            "jobs": g.get("jobs", []),
        })  # fmt: skip
    return merged


def jobs_with_gpus(jobs: list[dict[str, Any]], gpus: dict[str, Any]) -> list[dict[str, Any]]:
    """Each job with `gpu_utilization` (its GPUs' mean now, None: unknown or holding none),
    `gpu_average` (over its attempt) and `idle`."""
    by_job = {j["job_id"]: j for j in gpus.get("jobs", ())}
    return [
        {
            **j,
            "gpu_utilization": by_job.get(j["job_id"], {}).get("utilization"),
            "gpu_average": by_job.get(j["job_id"], {}).get("average"),
            "idle": bool(by_job.get(j["job_id"], {}).get("idle", False)),
        }
        for j in jobs
    ]


def job_utilization(j: dict[str, Any]) -> str:
    """A job's GPU column: its utilization, and IDLE when flagged; '-' holding no GPUs."""
    if not j.get("gpus_held"):
        return "-"
    text = percent(j.get("gpu_utilization"))
    return f"{text} [bold yellow]IDLE[/]" if j.get("idle") else text


def gpus_table(nodes: list[dict[str, Any]]) -> Table:
    """One row per GPU: its node, model, utilization, memory, temperature, power, job."""
    table = Table(title="GPUs", title_justify="left", box=None, header_style="bold")
    for column in ("NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "JOB"):
        right = column in ("GPU", "UTIL", "TEMP", "POWER")
        table.add_column(column, justify="right" if right else "left")
    for n in nodes:
        for d in n["devices"]:
            temp, power = d.get("temperature_c"), d.get("power_w")
            job = d.get("job_id") or ("(another project's)" if d.get("held") else "-")
            if d.get("idle"):
                job += " [bold yellow]IDLE[/]"
            table.add_row(
                escape(n["node"]),
                str(d["index"]),
                escape(d.get("model") or UNKNOWN),
                percent(d.get("utilization")),
                memory(d.get("memory_used_mb"), d.get("memory_total_mb")),
                UNKNOWN if temp is None else f"{temp}°C",
                UNKNOWN if power is None else f"{power:.0f} W",
                job if d.get("idle") else escape(job),
            )
    return table


def print_gpus(nodes: list[dict[str, Any]]) -> None:
    if any(n["devices"] for n in nodes):
        console.print()
        console.print(gpus_table(nodes))
        for why, names in unsampled(nodes).items():
            console.print(f"[dim]no readings from {escape(', '.join(names))}: {escape(why)}[/]")


def not_sampled(node: dict[str, Any]) -> str | None:
    """Why the node's GPUs have no readings (None: they have NVML's): what its executor's
    sampler said, else that no recent sample came."""
    if node.get("source") == "nvml":
        return None
    return node.get("error") or "no recent sample from its executor"


def unsampled(nodes: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The nodes without readings, by why (one line for a cluster of machines without NVML)."""
    found: dict[str, list[str]] = {}
    for n in nodes:
        why = not_sampled(n)
        if why is not None and n.get("devices"):
            found.setdefault(why, []).append(n["node"])
    return found
