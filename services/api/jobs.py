"""The job routes: submit, cancel, pause, resume and reprioritize (commands), and the jobs as the
read models hold them, now or as of a log position.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, delete, get, patch, post
from litestar.params import JSONBody, PathParameter, QueryParameter

from events import JobSpec, PortMapping, VolumeMount
from events.commands import CancelJob, PauseJob, ResumeJob, SetJobPriority, SubmitJob
from services.api import queries
from services.api.callers import Who, may_act, may_read, readable_job
from services.api.commands import job_command, send_command
from services.api.context import Ctx, NodeRuntime
from services.api.errors import ACT_ERRORS, FOUND_ERRORS, fail, strictly
from services.api.params import After, JobState, Limit, PathName, QueryName
from services.api.types import Accepted, Job, JobDetail, JobPage, JobUpdate, SubmitRequest


@post("/v1/jobs", status_code=201, responses=ACT_ERRORS, tags=["jobs"])
async def submit_job(
    ctx: Ctx, caller: Who, request: Request[Any, Any, Any], data: JSONBody[SubmitRequest]
) -> Accepted:
    """Submit a job; answers with the event admission recorded (`JobAdmitted`)."""
    data = await strictly(request, SubmitRequest)
    may_act(caller, data.project)
    _runs_here(ctx.node_runtime, data)
    command = SubmitJob(
        actor=caller.name,
        job_id=data.job_id,
        spec=_spec(data),
        idempotency_key=data.idempotency_key,
    )
    return await send_command(ctx, command)


def _runs_here(node_runtime: NodeRuntime | None, data: SubmitRequest) -> None:
    """Refuse what the nodes would not do: an image or volumes where workloads are processes."""
    if data.image is not None and node_runtime == "process":
        raise fail(
            422,
            f"this cluster's nodes run workloads as processes, not containers: the image "
            f"{data.image!r} would be ignored (leave it out, or run the nodes' executors with "
            "--runtime docker)",
            "image",
        )
    if data.volumes and node_runtime == "process":
        raise fail(
            422,
            f"this cluster's nodes run workloads as processes, not containers: the volume "
            f"{data.volumes[0].host!r} would not be mounted (leave --volume out, or run the "
            "nodes' executors with --runtime docker)",
            "volumes",
        )


def _spec(data: SubmitRequest) -> JobSpec:
    """The job's spec as the request gives it (a port or volume without a container side has
    the host's)."""
    return JobSpec(
        project=data.project,
        priority_class=data.job_class,
        priority=data.priority,
        gpus=data.gpus,
        replicas=data.replicas,
        min_replicas=data.min_replicas,
        pools=tuple(data.pools),
        node=data.node,
        command=tuple(data.command),
        image=data.image,
        env=tuple(f"{k}={v}" for k, v in data.env.items()),
        preemptible=data.preemptible,
        preemption_delay_s=data.preemption_delay_s,
        min_runtime_s=data.min_runtime_s,
        grace_s=data.grace_s,
        working_dir=data.working_dir,
        ports=tuple(
            PortMapping(p.host, p.host if p.container is None else p.container) for p in data.ports
        ),
        volumes=tuple(
            VolumeMount(v.host, v.host if v.container is None else v.container, v.read_only)
            for v in data.volumes
        ),
    )


@delete("/v1/jobs/{job_id:str}", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def delete_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Delete (cancel) a job; a running one is stopped."""
    return await job_command(ctx, caller, job_id, CancelJob(actor=caller.name, job_id=job_id))


@post("/v1/jobs/{job_id:str}/pause", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def pause_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Pause a job: it checkpoints, gives its GPUs back and waits until resumed."""
    return await job_command(ctx, caller, job_id, PauseJob(actor=caller.name, job_id=job_id))


@post("/v1/jobs/{job_id:str}/resume", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def resume_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Resume a paused job: it queues again."""
    return await job_command(ctx, caller, job_id, ResumeJob(actor=caller.name, job_id=job_id))


@patch("/v1/jobs/{job_id:str}", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def update_job(
    ctx: Ctx, caller: Who, job_id: PathName, data: JSONBody[JobUpdate]
) -> Accepted:
    """Change a job's priority while it waits or runs (`JobPriorityChanged`); the policy
    weighs it from its next cycle on."""
    command = SetJobPriority(actor=caller.name, job_id=job_id, priority=data.priority)
    return await job_command(ctx, caller, job_id, command)


@get("/v1/jobs", responses=FOUND_ERRORS, tags=["jobs"])
async def list_jobs(
    ctx: Ctx,
    caller: Who,
    project: QueryName = None,
    job_state: Annotated[JobState | None, QueryParameter(name="state")] = None,
    pool: QueryName = None,
    after: After = None,
    limit: Limit = 50,
) -> JobPage:
    """Jobs in submission order, filtered by project, state and pool (a token's own projects'
    jobs only, unless it is an admin token)."""
    if project is not None:
        may_read(caller, project)
    async with ctx.db.acquire() as conn:
        items, next_after = await queries.jobs_page(
            conn,
            project=project,
            state=job_state,
            pool=pool,
            after=after,
            limit=limit,
            visible=caller.visible,
        )
    return JobPage(items=items, next=next_after)


@get("/v1/jobs/{job_id:str}", responses=FOUND_ERRORS, tags=["jobs"])
async def job_detail(ctx: Ctx, caller: Who, job_id: PathName) -> JobDetail:
    """A job, with why it is waiting if it is."""
    await readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        found = await queries.job_detail(conn, job_id)
    if found is None:
        raise fail(404, f"unknown job id {job_id!r}", "job_id")
    return found


@get("/v1/jobs/{job_id:str}/as-of/{seq:int}", responses=FOUND_ERRORS, tags=["timeline"])
async def job_as_of(
    ctx: Ctx,
    caller: Who,
    job_id: PathName,
    seq: Annotated[int, PathParameter(ge=1, le=1 << 62)],
) -> Job:
    """The job as it stood once the event at log position `seq` was applied."""
    await readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        found = await queries.job_as_of(conn, job_id, seq)
    if found is None:
        raise fail(404, f"job {job_id!r} did not exist at position {seq}", "job_id")
    return found
