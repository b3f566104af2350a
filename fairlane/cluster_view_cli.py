"""Projects and pools, through the HTTP API: their quotas, shares and use, and setting them."""

from __future__ import annotations

from typing import Any, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from events.units import parse_duration
from fairlane.api_options import Connection, connected
from fairlane.client import named
from fairlane.output import (
    USAGE,
    USAGE_FLAGS,
    MaybeWhole,
    Output,
    console,
    emit,
    errors_said,
    fail,
    flags_named,
)
from policy.decay import settings_problem


def projects(
    name: str | None = None,
    /,
    *,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Projects per pool: quota, over-quota weight, limit, priority, fair share, GPUs in use,
    and whether they are over quota.

    ```
    fairlane projects
    fairlane projects team-a -o yaml
    ```

    Parameters
    ----------
    name
        Only this project.
    """
    with errors_said(), connected(connection) as api:
        if name is None:
            found = api.get("/v1/projects")
        else:
            found = [api.get(f"/v1/projects/{named('NAME', name)}")]
        emit(found, output, projects_table)


def projects_table(found: list[dict[str, Any]]) -> None:
    if not found:
        console.print("no projects")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("PROJECT")
    table.add_column("POOL")
    for column in ("QUOTA", "WEIGHT", "LIMIT", "PRIORITY", "FAIR SHARE", "IN USE"):
        table.add_column(column, justify="right")
    table.add_column("OVER QUOTA")
    table.add_column("U", justify="right")  # rule 11: decayed usage, a part of the pool
    for project in found:
        for p in project["pools"]:
            over = "[yellow]yes[/]" if p["over_quota"] else "no"
            table.add_row(
                escape(project["name"]),
                escape(p["pool"]),
                str(p["quota"]),
                str(p["over_quota_weight"]),
                "-" if p["limit"] is None else str(p["limit"]),
                str(p["priority"]),
                str(p["fair_share"]),
                str(p["usage"]),
                over,
                _part(p.get("decayed_usage")),
            )
    console.print(table)


def _part(u: float | None) -> str:
    return "-" if u is None else f"{100 * u:.0f}%"


def project_set(
    name: str,
    /,
    *,
    quota: MaybeWhole = None,
    pool: str | None = None,
    weight: MaybeWhole = None,
    limit: MaybeWhole = None,
    no_limit: bool = False,
    priority: MaybeWhole = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Create or change a project in one pool (admin token); what is not given keeps its value.

    ```
    fairlane project set team-a --quota 4 --weight 1 --limit 6
    ```

    Parameters
    ----------
    quota
        Guaranteed GPUs.
    pool
        The pool (default: the default compute pool).
    weight
        Over-quota weight: its share of idle GPUs beyond quotas (0: none).
    limit
        Hard cap on GPUs.
    no_limit
        Remove the limit.
    priority
        Project priority (higher is served first).
    """
    body: dict[str, Any] = {"no_limit": no_limit}
    given = {"pool": pool, "quota": quota, "over_quota_weight": weight, "limit": limit}
    body.update({k: v for k, v in {**given, "priority": priority}.items() if v is not None})
    with (
        errors_said(),
        connected(connection) as api,
        flags_named(body, {"over_quota_weight": "--weight"}),
    ):
        answer = api.put(f"/v1/projects/{named('NAME', name)}", body)
        emit(answer, output, lambda a: _configured(f"project {name}", a))


def pool_set(
    name: str,
    /,
    *,
    scheduler: Literal["fair_share", "priority", "round_robin"] | None = None,
    fitting: Literal["best", "worst"] = "best",
    victim_order: Literal["newest", "cost"] = "newest",
    usage_half_life: str | None = None,
    usage_k: float = 1.0,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Create a pool or set its own scheduler settings (they replace the cluster's as a whole;
    admin token).

    ```
    fairlane pool set default --scheduler fair_share --fitting best --victim-order cost
    fairlane pool set default --usage-half-life 2h --usage-k 1
    ```

    Parameters
    ----------
    scheduler
        The pool's scheduler; leave out to follow the cluster's settings.
    fitting
        best packs, worst spreads (with --scheduler).
    victim_order
        newest, or cost (least lost work) (with --scheduler).
    usage_half_life
        Time-aware fairness (rule 11): the half-life of the usage history the fair share
        weighs (2h, 1d, ...); a project that used much of the pool lately gets a smaller share.
    usage_k
        How strongly the history moves the shares (0: not at all; default 1).
    """
    body: dict[str, Any] = {"scheduler": scheduler, "fitting": fitting}
    body["victim_order"] = victim_order
    if usage_half_life is not None or usage_k != 1.0:
        body.update(_usage_settings(usage_half_life, usage_k))
    with errors_said(), connected(connection) as api, flags_named(body):
        answer = api.put(f"/v1/pools/{named('NAME', name)}", body)
        emit(answer, output, lambda a: _configured(f"pool {name}", a))


def _usage_settings(half_life: str | None, k: float) -> dict[str, Any]:
    """Rule 11's settings as the API takes them, checked here first so that a bad value is
    named as it was typed."""
    seconds = None
    if half_life is not None:
        try:
            seconds = parse_duration(half_life)
        except ValueError as e:
            fail(f"--usage-half-life: {e}", USAGE)
    problem = settings_problem(seconds, k, USAGE_FLAGS)
    if problem is not None:
        fail(problem, USAGE)
    return {"usage_half_life_s": seconds, "usage_k": k}


def _configured(what: str, answer: dict[str, Any]) -> None:
    event = answer.get("event", {})
    if "terms" in event:  # a project: its terms in each pool
        parts = [
            f"in {pool}: quota {t['quota']}, weight {t['over_quota_weight']}, "
            f"limit {'none' if t['limit'] is None else t['limit']}, priority {t['priority']}"
            for pool, t in event["terms"].items()
        ]
        text = "; ".join(parts)
    else:
        settings = event.get("scheduler")
        text = f"scheduler {_pairs(settings)}" if settings else "follows the cluster's settings"
    console.print(f"{escape(what)} configured {escape(text)} [dim]({answer.get('type')})[/]")


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


project_app = cyclopts.App(name="project", help="Set a project's quota, weight, limit, priority.")
project_app.command(project_set, name="set")
pool_app = cyclopts.App(name="pool", help="Pools and their scheduler settings.")
pool_app.command(pool_set, name="set")
