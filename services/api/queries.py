"""Reading the read models: every query the API answers, as SQL on the projector's tables."""

from __future__ import annotations

import time
from typing import Any, Final

import asyncpg
import msgspec

from events import decode_event
from projections import as_of
from services.api.types import (
    Job,
    JobDetail,
    Node,
    OverQuotaPeriod,
    Pool,
    Preemption,
    Project,
    ProjectPool,
    ProjectThen,
    TimelineEntry,
)
from services.api.why import Standing, pending_reason

QUEUED: Final = ("submitted", "pending")
_json = msgspec.json.Decoder(dict[str, Any])
_JOB_COLUMNS: Final = (
    'job_id, "order", project, pool, pools, state, priority, preemptible, gpus, replicas,'
    " min_replicas, attempt, gpus_held, nodes, submitted_at, state_since, queued_s, running_s,"
    " gpu_s, accounted_at, first_started_at, preemptions, nominated, reject_reason, waiting,"
    " last_seq, ports, urls, volumes"
)


def job_from(row: asyncpg.Record | dict[str, Any], now: float) -> Job:
    """A job row with its clocks brought up to `now` (they are stored as of its last event)."""
    since = max(0.0, now - row["accounted_at"])
    state = row["state"]
    return Job(
        job_id=row["job_id"],
        project=row["project"],
        pool=row["pool"],
        pools=list(row["pools"]),
        state=state,
        priority=row["priority"],
        preemptible=row["preemptible"],
        gpus=row["gpus"],
        replicas=row["replicas"],
        min_replicas=row["min_replicas"],
        attempt=row["attempt"],
        gpus_held=row["gpus_held"],
        nodes=list(row["nodes"]),
        submitted_at=row["submitted_at"],
        state_since=row["state_since"],
        queued_s=row["queued_s"] + (since if state in QUEUED else 0.0),
        running_s=row["running_s"] + (since if state == "running" else 0.0),
        gpu_hours=(row["gpu_s"] + row["gpus_held"] * since) / 3600.0,
        preemptions=row["preemptions"],
        first_started_at=row["first_started_at"],
        last_seq=row["last_seq"],
        waiting=row["waiting"],
        ports=list(row["ports"]),
        urls=list(row["urls"]),
        volumes=list(row["volumes"]),
    )


async def jobs_page(
    conn: asyncpg.Connection,
    *,
    project: str | None,
    state: str | None,
    pool: str | None,
    after: int | None,
    limit: int,
    visible: frozenset[str] | None = None,
) -> tuple[list[Job], int | None]:
    """`visible`: the projects the caller may read (None: every project)."""
    where: list[str] = ["true"]
    args: list[object] = []
    for column, value in (("project", project), ("state", state), ("pool", pool)):
        if value is not None:
            args.append(value)
            where.append(f"{column} = ${len(args)}")
    if visible is not None:
        args.append(sorted(visible))
        where.append(f"project = ANY(${len(args)}::text[])")
    if after is not None:
        args.append(after)
        where.append(f'"order" > ${len(args)}')
    args.append(limit + 1)
    rows = await conn.fetch(
        f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)}"
        f' ORDER BY "order" LIMIT ${len(args)}',
        *args,
    )
    now = time.time()
    items = [job_from(r, now) for r in rows[:limit]]
    return items, (rows[limit - 1]["order"] if len(rows) > limit else None)


async def job_project(conn: asyncpg.Connection, job_id: str) -> str | None:
    project: str | None = await conn.fetchval("SELECT project FROM jobs WHERE job_id = $1", job_id)
    return project


async def job_detail(conn: asyncpg.Connection, job_id: str) -> JobDetail | None:
    row = await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
    if row is None:
        return None
    job = job_from(row, time.time())
    reason = None
    if job.state in ("submitted", "pending", "paused", "stopping"):
        reason = pending_reason(await _standing(conn, row))
    return JobDetail(
        **msgspec.structs.asdict(job),
        pending_reason=reason,
        reject_reason=row["reject_reason"] or None,
    )


async def _standing(conn: asyncpg.Connection, job: asyncpg.Record) -> Standing:
    pool = job["pool"]
    terms = await conn.fetchrow(
        'SELECT usage, quota, "limit", fair_share FROM project_pools'
        " WHERE project = $1 AND pool = $2",
        job["project"],
        pool,
    )
    free = await conn.fetchval(
        "SELECT sum(free) FROM nodes WHERE pool = $1 AND NOT lost", pool
    )  # one row per node: small
    last = await conn.fetchrow(
        "SELECT reason, beneficiary FROM preemptions WHERE victim = $1 AND attempt = $2",
        job["job_id"],
        job["attempt"],
    )
    return Standing(
        state=job["state"],
        waiting=job["waiting"],
        preemptible=job["preemptible"],
        gpus_wanted=job["min_replicas"] * job["gpus"],
        pool=pool,
        pool_free=None if free is None else int(free),
        project=job["project"],
        usage=terms["usage"] if terms else 0,
        quota=terms["quota"] if terms else 0,
        limit=terms["limit"] if terms else None,
        fair_share=terms["fair_share"] if terms else 0,
        last_preemption=(last["reason"], last["beneficiary"]) if last else None,
        ports=tuple(job["ports"]),
    )


_COLUMNS: Final = (
    "seq, time, type, actor, job_id, project, pool, nodes, reason, for_job, applied, data"
)
#: Events that end a job's attempt (an elastic job's partial stop aside).
_ENDS: Final = "'JobCompleted', 'JobFailed', 'JobPreempted', 'JobCancelled'"


def _job_events(job: str) -> str:
    """A job's events, and the loss of a node its running attempt was placed on: the log
    records `NodeLost` about the node alone, and the fold queues the node's jobs again
    without an event of theirs, so without it a job's timeline would not say why its attempt
    ended. (`job` is the query parameter naming the job.)"""
    return f"""(
        SELECT {_COLUMNS} FROM timeline WHERE job_id = {job}
        UNION ALL
        SELECT lost.seq, lost.time, lost.type, lost.actor, {job}, placed.project, placed.pool,
               lost.nodes, lost.reason, lost.for_job, lost.applied, lost.data
        FROM timeline lost
        JOIN LATERAL (
            SELECT seq, project, pool, data->>'attempt' AS attempt FROM timeline
            WHERE job_id = {job} AND type = 'JobScheduled' AND applied AND seq < lost.seq
            ORDER BY seq DESC LIMIT 1
        ) placed ON true
        WHERE lost.type = 'NodeLost' AND lost.applied
          AND EXISTS (
            SELECT 1 FROM timeline s WHERE s.job_id = {job} AND s.type = 'JobScheduled'
              AND s.applied AND s.data->>'attempt' = placed.attempt AND s.nodes && lost.nodes)
          AND NOT EXISTS (
            SELECT 1 FROM timeline e WHERE e.job_id = {job} AND e.applied
              AND e.seq > placed.seq AND e.seq < lost.seq AND e.type IN ({_ENDS}))
          AND NOT EXISTS (
            SELECT 1 FROM timeline again WHERE again.type = 'NodeLost' AND again.applied
              AND again.seq > placed.seq AND again.seq < lost.seq
              AND again.nodes && lost.nodes)
    ) AS job_events"""


async def timeline(
    conn: asyncpg.Connection,
    *,
    job: str | None = None,
    project: str | None = None,
    node: str | None = None,
    types: list[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    after: int | None = None,
    limit: int = 100,
    visible: frozenset[str] | None = None,
    before: int | None = None,
    newest: bool = False,
) -> tuple[list[TimelineEntry], int | None]:
    """`visible`: the projects the caller may read (None: every project); events of no
    project (nodes, pools, the cluster) are everyone's. The page is in log order either way:
    the first `limit` events that match, the next position to pass as `after` if there are
    more; or with `newest`, the last `limit` of them, the position to pass as `before` if
    there are earlier ones."""
    where: list[str] = ["true"]
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    source = "timeline"
    if job is not None:
        source = _job_events(arg(job))
    if project is not None:
        where.append(f"project = {arg(project)}")
    if node is not None:
        where.append(f"nodes @> ARRAY[{arg(node)}]::text[]")
    if types:
        where.append(f"type = ANY({arg(types)}::text[])")
    if visible is not None:
        where.append(f"(project IS NULL OR project = ANY({arg(sorted(visible))}::text[]))")
    if since is not None:
        where.append(f"time >= {arg(since)}")
    if until is not None:
        where.append(f"time < {arg(until)}")
    if after is not None:
        where.append(f"seq > {arg(after)}")
    if before is not None:
        where.append(f"seq < {arg(before)}")
    rows = await conn.fetch(
        "SELECT seq, time, type, actor, job_id, project, pool, nodes, reason, for_job, applied,"
        f" data::text AS data FROM {source} WHERE {' AND '.join(where)}"
        f" ORDER BY seq {'DESC' if newest else ''} LIMIT {arg(limit + 1)}",
        *args,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    if newest:
        rows.reverse()
    items = [
        TimelineEntry(
            seq=r["seq"],
            time=r["time"],
            type=r["type"],
            actor=r["actor"],
            job_id=r["job_id"],
            project=r["project"],
            pool=r["pool"],
            nodes=list(r["nodes"]),
            reason=r["reason"],
            for_job=r["for_job"],
            applied=r["applied"],
            event=_json.decode(r["data"]),
        )
        for r in rows
    ]
    if not more:
        return items, None
    return items, rows[0]["seq"] if newest else rows[-1]["seq"]


def _project_pool(r: asyncpg.Record) -> ProjectPool:
    return ProjectPool(
        project=r["project"],
        pool=r["pool"],
        quota=r["quota"],
        over_quota_weight=r["over_quota_weight"],
        limit=r["limit"],
        priority=r["priority"],
        usage=r["usage"],
        fair_share=r["fair_share"],
        over_quota=r["over_quota"],
        decayed_usage=r["decayed_usage"],
    )


async def projects(conn: asyncpg.Connection, name: str | None = None) -> list[Project]:
    """Projects with their standing per pool: those configured, or holding GPUs somewhere."""
    rows = await conn.fetch(
        "SELECT * FROM project_pools WHERE ($1::text IS NULL OR project = $1)"
        " AND (quota > 0 OR usage > 0 OR fair_share > 0 OR last_seq > 0)"
        " ORDER BY project, pool",
        name,
    )
    periods = await conn.fetch(
        "SELECT project, pool, started_at, ended_at FROM over_quota_periods"
        " WHERE ($1::text IS NULL OR project = $1) ORDER BY project, started_seq",
        name,
    )
    found: dict[str, Project] = {}
    for r in rows:
        found.setdefault(r["project"], Project(r["project"], [], [])).pools.append(_project_pool(r))
    for p in periods:
        if p["project"] in found:
            found[p["project"]].over_quota_periods.append(
                OverQuotaPeriod(p["pool"], p["started_at"], p["ended_at"])
            )
    return list(found.values())


async def nodes(conn: asyncpg.Connection) -> list[Node]:
    rows = await conn.fetch("SELECT node, pool, gpus, free, lost, cordon FROM nodes ORDER BY node")
    return [Node(r["node"], r["pool"], r["gpus"], r["free"], r["lost"], r["cordon"]) for r in rows]


async def pools(conn: asyncpg.Connection) -> list[Pool]:
    rows = await conn.fetch(
        "SELECT n.pool, count(*) AS nodes, sum(n.gpus) AS gpus, sum(n.free) AS free,"
        " (SELECT count(*) FROM jobs j WHERE j.pool = n.pool AND j.state = ANY($1::text[]))"
        " AS queued FROM nodes n WHERE NOT n.lost GROUP BY n.pool ORDER BY n.pool",
        list(QUEUED),
    )
    return [
        Pool(
            pool=r["pool"],
            nodes=r["nodes"],
            gpus=int(r["gpus"]),
            free=int(r["free"]),
            allocated=int(r["gpus"]) - int(r["free"]),
            queued_jobs=r["queued"],
        )
        for r in rows
    ]


async def preemptions(
    conn: asyncpg.Connection,
    *,
    victim: str | None,
    beneficiary: str | None,
    after: int | None,
    limit: int,
    visible: frozenset[str] | None = None,
) -> tuple[list[Preemption], int | None]:
    """`visible`: the projects the caller may read (None: every project): the preemptions of
    their jobs, and those made for their jobs."""
    rows = await conn.fetch(
        "SELECT * FROM preemptions WHERE ($1::text IS NULL OR victim = $1)"
        " AND ($2::text IS NULL OR beneficiary = $2) AND ($3::bigint IS NULL OR seq > $3)"
        " AND ($5::text[] IS NULL OR EXISTS (SELECT 1 FROM jobs WHERE project = ANY($5)"
        " AND job_id IN (victim, beneficiary)))"
        " ORDER BY seq LIMIT $4",
        victim,
        beneficiary,
        after,
        limit + 1,
        None if visible is None else sorted(visible),
    )
    items = [
        Preemption(
            seq=r["seq"],
            victim=r["victim"],
            attempt=r["attempt"],
            reason=r["reason"],
            beneficiary=r["beneficiary"],
            pool=r["pool"],
            gpus=r["gpus"],
            requested_at=r["requested_at"],
            preempted_at=r["preempted_at"],
            checkpointed=r["checkpointed"],
            work_lost_gpu_s=r["work_lost_gpu_s"],
        )
        for r in rows[:limit]
    ]
    return items, (rows[limit - 1]["seq"] if len(rows) > limit else None)


async def projected_seq(conn: asyncpg.Connection) -> int:
    seq = await conn.fetchval("SELECT max(seq) FROM projector_position")
    return int(seq or 0)


async def job_as_of(conn: asyncpg.Connection, job_id: str, seq: int) -> Job | None:
    """The job as it stood once the event at `seq` was applied (see projections/as_of.py)."""
    rows = await conn.fetch(
        "SELECT seq, data::text AS data FROM timeline"
        " WHERE job_id = $1 AND applied AND seq <= $2 ORDER BY seq",
        job_id,
        seq,
    )
    row = as_of.job_as_of(job_id, [(r["seq"], decode_event(r["data"].encode())) for r in rows])
    if row is None:
        return None
    return job_from(msgspec.structs.asdict(row), row.accounted_at)


#: The most events a project's state as of a position is made again from.
PROJECT_HISTORY_MAX: Final = 200_000


class TooLong(Exception):
    pass


async def project_as_of(conn: asyncpg.Connection, project: str, seq: int) -> list[ProjectThen]:
    rows = await conn.fetch(
        "SELECT seq, data::text AS data FROM timeline"
        " WHERE project = $1 AND applied AND seq <= $2 ORDER BY seq LIMIT $3",
        project,
        seq,
        PROJECT_HISTORY_MAX + 1,
    )
    if len(rows) > PROJECT_HISTORY_MAX:
        raise TooLong(f"project {project!r} has more than {PROJECT_HISTORY_MAX} events by then")
    events = [(r["seq"], decode_event(r["data"].encode())) for r in rows]
    return [
        ProjectThen(
            pool=row.pool,
            quota=row.quota,
            over_quota_weight=row.over_quota_weight,
            limit=row.limit,
            priority=row.priority,
            usage=row.usage,
            over_quota=row.over_quota,
        )
        for row in as_of.project_as_of(project, events)
    ]
