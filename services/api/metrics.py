"""`/metrics` for Prometheus, read from the read models at each scrape (one query per family),
so any number of API instances report the same figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import asyncpg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

#: Submit-to-start buckets, seconds: interactive waits to a day in the queue.
WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class _Snapshot:
    """A collector of metric families made beforehand (the scrape's query results)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def render(
    conn: asyncpg.Connection, log_seq: int, extra: list[Metric] | None = None
) -> bytes:
    """Every metric, read from the tables now; `log_seq` is the log's last sequence (the
    read models' lag is measured against it); then `extra` (the GPUs', read elsewhere)."""
    families: list[Metric] = []
    projected = await conn.fetchval("SELECT max(seq) FROM projector_position")
    lag = GaugeMetricFamily(
        "fairlane_projector_lag_events",
        "Events on the log that the read models do not hold yet",
    )
    lag.add_metric([], float(max(0, log_seq - int(projected or 0))))
    aside = CounterMetricFamily(
        "fairlane_events_set_aside",
        "Events a service could not handle and set aside (EventSetAside), by service",
        labels=["service"],
    )
    for r in await conn.fetch(
        "SELECT data ->> 'service' AS service, count(*) AS n FROM timeline"
        " WHERE type = 'EventSetAside' GROUP BY 1 ORDER BY 1"
    ):
        aside.add_metric([r["service"] or ""], float(r["n"]))
    families += [lag, aside]
    allocated = GaugeMetricFamily(
        "fairlane_pool_gpus_allocated", "GPUs held by jobs, per pool", labels=["pool"]
    )
    free = GaugeMetricFamily("fairlane_pool_gpus_free", "Idle GPUs, per pool", labels=["pool"])
    for r in await conn.fetch(
        "SELECT pool, sum(gpus) AS gpus, sum(free) AS free FROM nodes WHERE NOT lost"
        " GROUP BY pool ORDER BY pool"
    ):
        allocated.add_metric([r["pool"]], float(r["gpus"] - r["free"]))
        free.add_metric([r["pool"]], float(r["free"]))
    families += [allocated, free]

    labels = ["project", "pool"]
    usage = GaugeMetricFamily("fairlane_project_gpus_used", "GPUs a project holds", labels=labels)
    quota = GaugeMetricFamily("fairlane_project_gpu_quota", "A project's quota", labels=labels)
    share = GaugeMetricFamily(
        "fairlane_project_fair_share", "A project's fair share", labels=labels
    )
    for r in await conn.fetch(
        "SELECT project, pool, usage, quota, fair_share FROM project_pools"
        " WHERE quota > 0 OR usage > 0 OR fair_share > 0 ORDER BY project, pool"
    ):
        usage.add_metric([r["project"], r["pool"]], float(r["usage"]))
        quota.add_metric([r["project"], r["pool"]], float(r["quota"]))
        share.add_metric([r["project"], r["pool"]], float(r["fair_share"]))
    families += [usage, quota, share]

    queue = GaugeMetricFamily(
        "fairlane_queue_length", "Jobs waiting (submitted or pending), per pool", labels=["pool"]
    )
    for r in await conn.fetch(
        "SELECT coalesce(pool, '') AS pool, count(*) AS n FROM jobs"
        " WHERE state IN ('submitted', 'pending') GROUP BY 1 ORDER BY 1"
    ):
        queue.add_metric([r["pool"]], float(r["n"]))
    families.append(queue)

    preempted = CounterMetricFamily(
        "fairlane_preemptions", "Jobs preempted to make room, by reason", labels=["reason"]
    )
    for r in await conn.fetch(
        "SELECT reason, count(*) AS n FROM preemptions GROUP BY reason ORDER BY reason"
    ):
        preempted.add_metric([r["reason"]], float(r["n"]))
    families.append(preempted)

    families.append(await _waits(conn))
    families += extra or []
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    return generate_latest(registry)


async def _waits(conn: asyncpg.Connection) -> HistogramMetricFamily:
    counts = ", ".join(
        f"count(*) FILTER (WHERE first_started_at - submitted_at <= {b})" for b in WAIT_BUCKETS
    )
    row = await conn.fetchrow(
        f"SELECT {counts}, count(*) AS n, coalesce(sum(first_started_at - submitted_at), 0)"
        " AS total FROM jobs WHERE first_started_at IS NOT NULL"
    )
    assert row is not None
    buckets = [(str(b), float(row[i])) for i, b in enumerate(WAIT_BUCKETS)]
    buckets.append(("+Inf", float(row["n"])))
    return HistogramMetricFamily(
        "fairlane_submit_to_start_seconds",
        "Time from submission to a job's first start",
        buckets=buckets,
        sum_value=float(row["total"]),
    )
