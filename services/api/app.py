"""The HTTP API (Litestar).

Commands (submit, delete, pause, resume; projects and pools) go to admission and the quota
ledger by NATS request/reply, as the CLI sends them; the answer is the event they led to.
Queries read the projector's tables. The live stream follows the log itself, so it is never
behind the events it shows and resumes from any sequence (`Last-Event-ID`).

Every route but /v1/health, /metrics and the docs needs `Authorization: Bearer <token>`. Any
token may read; acting on a job needs a token for its project (403 naming the project);
projects, pools and tokens need an admin token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
import typing
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

import asyncpg
import msgspec
import nats.errors
import structlog
from litestar import Litestar, Request, Response, delete, get, patch, post, put
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    PermissionDeniedException,
    SerializationException,
    ServiceUnavailableException,
    ValidationException,
)
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import HeaderParameter, JSONBody, PathParameter, QueryParameter
from litestar.response import Stream
from litestar.response.sse import ServerSentEvent, ServerSentEventMessage
from litestar.utils.scope.state import ScopeState

from events import (
    Event,
    JobSpec,
    JobSubmitted,
    PortMapping,
    SchedulerSettings,
    VolumeMount,
    VolumesConfigured,
    WorkRelayed,
    encode_event,
    subject_for,
)
from events.catalogue import AnyEvent
from events.commands import (
    AllowVolume,
    AnyCommand,
    CancelJob,
    CordonNode,
    DenyVolume,
    PauseJob,
    ResumeJob,
    SetJobPriority,
    SetPool,
    SetProject,
    SubmitJob,
    UncordonNode,
    in_words,
)
from events.versions import decode_event
from policy.audit import Scope
from policy.commands.config import scheduler_problem
from policy.commands.names import PATTERN as NAME_PATTERN
from services.api import audit as api_audit
from services.api import docs, gpus, history, logs, metrics, queries, tokens
from services.api.tokens import Caller
from services.api.types import (
    Accepted,
    Error,
    Health,
    Job,
    JobDetail,
    JobPage,
    JobUpdate,
    Node,
    NodeServiceRequest,
    PoolRequest,
    Preemption,
    Project,
    ProjectRequest,
    ProjectThen,
    SubmitRequest,
    TimelinePage,
    TokenCreated,
    TokenInfo,
    TokenRequest,
    VolumeAllowRequest,
    VolumeGrantView,
    Whoami,
)
from services.api.types import (
    Pool as PoolView,
)
from services.api.ui import dashboard_routes
from services.runtime.client import may_take_effect
from services.runtime.eventlog import EventLog, JetStreamLog, Stored, connect
from services.runtime.host import Host, NatsHost
from services.runtime.postgres import PG_TRANSIENT, connect_pool, migrate
from services.runtime.tasks import cancel_and_wait

log = structlog.get_logger("fairlane.api")
PAGE_MAX: Final = 500
#: A live stream quiet this long gets a comment line.
KEEP_ALIVE_S: Final = 15.0
JobState = Literal[
    "submitted", "pending", "starting", "running", "stopping", "paused",
    "completed", "failed", "cancelled", "rejected",
]  # fmt: skip

PathName = Annotated[str, PathParameter(pattern=NAME_PATTERN, max_length=128)]
QueryName = Annotated[str | None, QueryParameter(pattern=NAME_PATTERN, max_length=128)]
After = Annotated[
    int | None, QueryParameter(ge=0, le=1 << 62, description="the `next` of the page before")
]
Limit = Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)]
Types = Annotated[
    list[str] | None,
    QueryParameter(name="type", max_items=30, description="event types (repeat for several)"),
]
Since = Annotated[float | None, QueryParameter(ge=0, le=1e12, description="from this time")]
Until = Annotated[float | None, QueryParameter(ge=0, le=1e12, description="before this time")]


NodeRuntime = Literal["process", "docker"]


@dataclass(frozen=True)
class Settings:
    nats_url: str
    postgres_dsn: str
    admin_token_file: Path | None = None
    #: Live streams served at once (each holds a consumer on the log).
    max_streams: int = 64
    #: How every node's executor runs workloads, where the deployment knows it (the embedded
    #: cluster does): "process" refuses a job that names an image, which it would ignore.
    node_runtime: NodeRuntime | None = None


@dataclass
class Context:
    db: asyncpg.Pool
    #: the log, commands and what else the api reaches on the bus
    host: Host
    streams: StreamPlaces
    #: one audit at a time: each folds the whole log in a worker thread
    audits: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(1))
    node_runtime: NodeRuntime | None = None


Ctx = NamedDependency[Context]


class StreamPlaces:
    """The live streams served at once, counted exactly. A place is taken as the request is
    answered, with no await between the check and the taking (a semaphore checked there and
    taken once the stream started let 75 streams in under a cap of 64, the rest waiting
    rather than refused), and given back when the stream ends."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.taken = 0

    def take(self) -> Place:
        if self.taken >= self.most:
            raise ServiceUnavailableException(
                detail=f"too many live streams open (at most {self.most}); try again later"
            )
        self.taken += 1
        return Place(self)


class Place:
    """One live stream's place, given back once: when its stream ends, or, for a stream
    never sent (the client went before it started), when the stream is collected."""

    def __init__(self, places: StreamPlaces) -> None:
        self.places: StreamPlaces | None = places

    def give_back(self) -> None:
        if self.places is not None:
            self.places.taken -= 1
            self.places = None

    def __del__(self) -> None:
        self.give_back()


Who = NamedDependency[Caller]


# -- errors -----------------------------------------------------------------------------------


def _error(status: int, message: str, field: str | None = None) -> Response[Error]:
    return Response(Error(error=message, status=status, field=field), status_code=status)


#: Parameters whose Python name is not the one on the wire.
_ALIASES: Final = {
    "job_state": "state",
    "types": "type",
    "last_event_id": "Last-Event-ID",
    "first": "from",
    "last": "to",
}


def on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Error]:
    field, message = None, exc.detail
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            field = _ALIASES.get(first.get("key", ""), first.get("key"))
            said = in_words(str(first.get("message", exc.detail)))
            given = (
                _given(_body_read(request), field) if _source(first.get("source")) == "body" else ""
            )
            message = f"{said}{given} (in {_source(first.get('source'))})"
            if field:  # the message names the field too: not every client shows `field`
                message = f"{field}: {message}"
    elif isinstance(exc.extra, dict):
        field = exc.extra.get("field")
    return _error(exc.status_code, message, field)


def _source(source: object) -> str:
    """Where a bad value was: the body, or a query, path or header parameter."""
    if source is None:
        return "the request"
    return str(getattr(source, "value", source))


#: Where msgspec says a value broke a command's bounds: "... - at `$.limit`".
_AT_FIELD: Final = re.compile(r" - at `\$\.(\w+)")


def on_other_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Error]:
    if isinstance(exc, SerializationException | RecursionError | UnicodeDecodeError):
        said = str(exc) or type(exc).__name__
        return _error(400, f"the body is not JSON this API reads: {said}", "body")
    if isinstance(exc, msgspec.ValidationError):  # a request's values broke a command's bounds
        at = _AT_FIELD.search(str(exc))
        return _error(400, str(exc), at.group(1) if at else None)
    if isinstance(exc, PG_TRANSIENT):
        return _error(503, f"the read models are unavailable just now: {exc}")
    log.exception("request failed", path=request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}")


Body = TypeVar("Body", bound=msgspec.Struct)


async def _strictly(request: Request[Any, Any, Any], body_type: type[Body]) -> Body:
    """The body decoded again with msgspec's strict rules: Litestar converts a body loosely,
    taking `"gpus": "1"` for 1, and a command's types are exact (JSON says what it means)."""
    body = await request.body()
    try:
        return msgspec.json.decode(body, type=body_type)
    except msgspec.ValidationError as e:
        at = _AT_FIELD.search(str(e))
        field = at.group(1) if at else None
        said = f"{in_words(str(e))}{_given(body, field)} (in body)"
        raise _fail(400, f"{field}: {said}" if field else said, field) from None


def _body_read(request: Request[Any, Any, Any]) -> bytes:
    """The body as Litestar read it before it refused a value (nothing when it read none)."""
    body = ScopeState.from_scope(request.scope).body
    return body if isinstance(body, bytes) else b""


def _given(body: bytes, field: str | None) -> str:
    """`, given <value>` for a top-level field of the body, so the error names the value too
    (msgspec's message names only the bound); the value is cut short, the body is untrusted."""
    if field is None or not body:
        return ""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return ""
    if not isinstance(raw, dict) or field not in raw:
        return ""
    shown = msgspec.json.encode(raw[field]).decode()
    return f", given {shown[:60]}{'…' if len(shown) > 60 else ''}"


def _fail(status: int, message: str, field: str | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail=message, extra={"field": field})


ERRORS: Final = {
    400: ResponseSpec(Error, description="a value is malformed (`field` names it)"),
    401: ResponseSpec(Error, description="no token, or an unknown one"),
    503: ResponseSpec(Error, description="the cluster or the read models are unavailable"),
}
ACT_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="the token may not act on this project"),
    404: ResponseSpec(Error, description="no such job"),
    422: ResponseSpec(Error, description="refused by admission or the ledger (says why)"),
}
ADMIN_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="an admin token is needed"),
    422: ResponseSpec(Error, description="refused by the ledger (says why)"),
}
FOUND_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="the token does not cover the project (names it)"),
    404: ResponseSpec(Error, description="not found"),
}


# -- dependencies -----------------------------------------------------------------------------


def get_context(state: State) -> Context:
    context: Context = state.ctx
    return context


async def get_caller(request: Request[Any, Any, Any], ctx: Ctx) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise NotAuthorizedException(
            detail="an API token is needed: Authorization: Bearer <token>",
            extra={"field": "Authorization"},
        )
    async with ctx.db.acquire() as conn:
        try:
            caller = await tokens.lookup(conn, token.strip())
        except tokens.Expired as e:
            raise NotAuthorizedException(
                detail=f"API token {e} has expired (an admin makes a new one: fairlane token "
                "create)",
                extra={"field": "Authorization"},
            ) from None
    if caller is None:
        raise NotAuthorizedException(detail="unknown API token", extra={"field": "Authorization"})
    return caller


def _may_act(caller: Caller, project: str) -> None:
    if not caller.may_act_on(project):
        raise PermissionDeniedException(
            detail=f"token {caller.name!r} may not act on project {project!r}",
            extra={"field": "project"},
        )


def _may_read(caller: Caller, project: str) -> None:
    if not caller.may_act_on(project):
        raise PermissionDeniedException(
            detail=f"token {caller.name!r} may not read project {project!r}",
            extra={"field": "project"},
        )


async def _readable_job(ctx: Context, caller: Caller, job_id: str) -> None:
    """404 for a job nobody knows, 403 for another project's."""
    if caller.admin:
        return
    async with ctx.db.acquire() as conn:
        project = await queries.job_project(conn, job_id)
    if project is None:
        raise _fail(404, f"unknown job id {job_id!r}", "job_id")
    _may_read(caller, project)


def _admin(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise PermissionDeniedException(
            detail=f"an admin token is needed to {what}", extra={"field": "Authorization"}
        )


# -- commands ---------------------------------------------------------------------------------

#: The HTTP status of each refusal's code (`events.refusals.RefusalCode`, every one of them):
#: the one place a refusal becomes a status. Keyed by plain strings, as the reply carries it.
REFUSAL_STATUS: Final[dict[str, int]] = {
    "invalid_name": 422,
    "out_of_range": 422,
    "bad_port": 422,
    "unknown_project": 422,
    "unknown_pool": 422,
    "unknown_node": 422,
    "unknown_class": 422,
    "not_found": 404,
    "name_taken": 422,
    "never_fits": 422,
    "over_limit": 422,
    "not_in_pool": 422,
    "no_pool": 422,
    "wrong_phase": 422,
    "no_change": 422,
    "not_taken_here": 500,
    "ended": 422,
    "bad_volume": 422,
    "not_allowed": 422,
}
#: A refusal without a code (stored, or answered by a service, before codes were), or with
#: one this build does not know: refused as a request the cluster cannot carry out.
UNCODED_STATUS: Final = 422


async def _command(ctx: Context, command: AnyCommand) -> Accepted:
    try:
        reply = await ctx.host.request(command)
    except msgspec.ValidationError as e:  # out of bounds (a negative quota): unsent
        at = re.search(r"`\$\.(\w+)", str(e))
        raise _fail(400, str(e), at[1] if at else None) from None
    except nats.errors.NoRespondersError as e:  # it reached no service: nothing was done
        raise ServiceUnavailableException(
            detail=f"no answer to {type(command).__name__} from the cluster ({e!r}); "
            "nothing was done"
        ) from None
    except (nats.errors.TimeoutError, TimeoutError) as e:  # it may be carried out yet
        raise ServiceUnavailableException(
            detail=f"no answer to {type(command).__name__} from the cluster in time ({e!r}); "
            f"{may_take_effect(command)}"
        ) from None
    if reply.ok and reply.event is not None:
        event = msgspec.json.decode(encode_event(reply.event), type=dict[str, Any])
        return Accepted(type=type(reply.event).__name__, event=event)
    if reply.retryable:
        raise ServiceUnavailableException(detail=reply.error)
    status = REFUSAL_STATUS.get(reply.code or "", UNCODED_STATUS)
    raise _fail(status, reply.error or "refused", reply.field)


@post("/v1/jobs", status_code=201, responses=ACT_ERRORS, tags=["jobs"])
async def submit_job(
    ctx: Ctx, caller: Who, request: Request[Any, Any, Any], data: JSONBody[SubmitRequest]
) -> Accepted:
    """Submit a job; answers with the event admission recorded (`JobAdmitted`)."""
    data = await _strictly(request, SubmitRequest)
    _may_act(caller, data.project)
    if data.image is not None and ctx.node_runtime == "process":
        raise _fail(
            422,
            f"this cluster's nodes run workloads as processes, not containers: the image "
            f"{data.image!r} would be ignored (leave it out, or run the nodes' executors with "
            "--runtime docker)",
            "image",
        )
    if data.volumes and ctx.node_runtime == "process":
        raise _fail(
            422,
            f"this cluster's nodes run workloads as processes, not containers: the volume "
            f"{data.volumes[0].host!r} would not be mounted (leave --volume out, or run the "
            "nodes' executors with --runtime docker)",
            "volumes",
        )
    spec = JobSpec(
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
    command = SubmitJob(
        actor=caller.name, job_id=data.job_id, spec=spec, idempotency_key=data.idempotency_key
    )
    return await _command(ctx, command)


async def _job_command(ctx: Context, caller: Caller, job_id: str, command: AnyCommand) -> Accepted:
    async with ctx.db.acquire() as conn:
        project = await queries.job_project(conn, job_id)
        if project is None and await _caught_up(ctx, conn):  # submitted a moment ago?
            project = await queries.job_project(conn, job_id)
    if project is None:
        raise _fail(404, f"unknown job id {job_id!r}", "job_id")
    _may_act(caller, project)
    return await _command(ctx, command)


async def _caught_up(ctx: Context, conn: asyncpg.Connection, within: float = 3.0) -> bool:
    """Wait (a little) until the read models hold everything the log holds now, so a job
    submitted a moment ago can be acted on; False if they are not there in time."""
    target = await ctx.host.log.last_seq()
    deadline = asyncio.get_running_loop().time() + within
    while await queries.projected_seq(conn) < target:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@delete("/v1/jobs/{job_id:str}", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def delete_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Delete (cancel) a job; a running one is stopped."""
    return await _job_command(ctx, caller, job_id, CancelJob(actor=caller.name, job_id=job_id))


@post("/v1/jobs/{job_id:str}/pause", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def pause_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Pause a job: it checkpoints, gives its GPUs back and waits until resumed."""
    return await _job_command(ctx, caller, job_id, PauseJob(actor=caller.name, job_id=job_id))


@post("/v1/jobs/{job_id:str}/resume", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def resume_job(ctx: Ctx, caller: Who, job_id: PathName) -> Accepted:
    """Resume a paused job: it queues again."""
    return await _job_command(ctx, caller, job_id, ResumeJob(actor=caller.name, job_id=job_id))


@patch("/v1/jobs/{job_id:str}", status_code=200, responses=ACT_ERRORS, tags=["jobs"])
async def update_job(
    ctx: Ctx, caller: Who, job_id: PathName, data: JSONBody[JobUpdate]
) -> Accepted:
    """Change a job's priority while it waits or runs (`JobPriorityChanged`); the policy
    weighs it from its next cycle on."""
    command = SetJobPriority(actor=caller.name, job_id=job_id, priority=data.priority)
    return await _job_command(ctx, caller, job_id, command)


@put("/v1/projects/{name:str}", responses=ADMIN_ERRORS, tags=["projects"])
async def set_project(
    ctx: Ctx,
    caller: Who,
    request: Request[Any, Any, Any],
    name: PathName,
    data: JSONBody[ProjectRequest],
) -> Accepted:
    """Create or change a project's terms in one pool (admin)."""
    data = await _strictly(request, ProjectRequest)
    _admin(caller, "change projects")
    command = SetProject(
        actor=caller.name,
        project=name,
        pool=data.pool,
        quota=data.quota,
        over_quota_weight=data.over_quota_weight,
        limit=data.limit,
        no_limit=data.no_limit,
        priority=data.priority,
    )
    return await _command(ctx, command)


@put("/v1/pools/{name:str}", responses=ADMIN_ERRORS, tags=["pools"])
async def set_pool(
    ctx: Ctx,
    caller: Who,
    request: Request[Any, Any, Any],
    name: PathName,
    data: JSONBody[PoolRequest],
) -> Accepted:
    """Create a pool or set its own scheduler settings (admin)."""
    data = await _strictly(request, PoolRequest)
    _admin(caller, "change pools")
    settings = (
        SchedulerSettings(type=data.scheduler, fitting=data.fitting, victim_order=data.victim_order)
        if data.scheduler is not None
        else None
    )
    settings = _with_usage(settings, data)
    problem = scheduler_problem(settings)  # rule 11's bounds: said before anything is sent
    if problem is not None:
        raise _fail(400, problem.reason, problem.field)
    return await _command(ctx, SetPool(actor=caller.name, pool=name, scheduler=settings))


@post("/v1/nodes/{name:str}/cordon", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def cordon_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Cordon a node (admin): it takes no new work; what runs there keeps running."""
    _admin(caller, "cordon nodes")
    reason = data.reason if data is not None else ""
    return await _command(ctx, CordonNode(actor=caller.name, node=name, reason=reason))


@post("/v1/nodes/{name:str}/drain", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def drain_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Drain a node (admin): it takes no new work, and its jobs checkpoint, stop (reason
    `drain` on their timeline) and are placed elsewhere by the usual rules."""
    _admin(caller, "drain nodes")
    reason = data.reason if data is not None else ""
    command = CordonNode(actor=caller.name, node=name, drain=True, reason=reason)
    return await _command(ctx, command)


@post("/v1/nodes/{name:str}/uncordon", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def uncordon_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Put a cordoned or drained node back in service (admin)."""
    _admin(caller, "uncordon nodes")
    reason = data.reason if data is not None else ""
    return await _command(ctx, UncordonNode(actor=caller.name, node=name, reason=reason))


#: Where the allowlist is: the last `VolumesConfigured` holds all of it.
_VOLUMES_SUBJECT: Final = subject_for(VolumesConfigured(id="", time=0.0, actor="", grants=()))
HostPrefix = Annotated[str, QueryParameter(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")]


@get("/v1/volumes", responses=ERRORS, tags=["volumes"])
async def list_volumes(ctx: Ctx, caller: Who) -> list[VolumeGrantView]:
    """The host path prefixes jobs may mount (`--volume`), each read-only or read-write."""
    last = await ctx.host.log.last_on(_VOLUMES_SUBJECT)
    if last is None or not isinstance(last.event, VolumesConfigured):
        return []
    return [VolumeGrantView(g.prefix, g.read_write) for g in last.event.grants]


@post("/v1/volumes", status_code=200, responses=ADMIN_ERRORS, tags=["volumes"])
async def allow_volume(
    ctx: Ctx, caller: Who, request: Request[Any, Any, Any], data: JSONBody[VolumeAllowRequest]
) -> Accepted:
    """Let jobs mount a host folder and what is under it (admin); read-only unless
    `read_write`. What this lets a tenant reach: docs/operations.md."""
    data = await _strictly(request, VolumeAllowRequest)
    _admin(caller, "allow volumes")
    command = AllowVolume(
        actor=caller.name, host_prefix=data.host_prefix, read_write=data.read_write
    )
    return await _command(ctx, command)


@delete("/v1/volumes", status_code=200, responses=ADMIN_ERRORS, tags=["volumes"])
async def deny_volume(ctx: Ctx, caller: Who, prefix: HostPrefix) -> Accepted:
    """Take a host prefix off the allowlist (admin); jobs admitted before keep their mounts."""
    _admin(caller, "deny volumes")
    return await _command(ctx, DenyVolume(actor=caller.name, host_prefix=prefix))


def _with_usage(settings: SchedulerSettings | None, data: PoolRequest) -> SchedulerSettings | None:
    """Rule 11's settings on the pool's own (a half-life alone gives it the default scheduler)."""
    if data.usage_half_life_s is None and data.usage_k == 1.0:
        return settings
    return msgspec.structs.replace(
        settings or SchedulerSettings(),
        usage_half_life_s=data.usage_half_life_s,
        usage_k=data.usage_k,
    )


# -- queries ----------------------------------------------------------------------------------


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
        _may_read(caller, project)
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
    await _readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        found = await queries.job_detail(conn, job_id)
    if found is None:
        raise _fail(404, f"unknown job id {job_id!r}", "job_id")
    return found


#: A time the log stream can start from (a date, so before the year 10000).
LogSince = Annotated[
    float | None, QueryParameter(ge=0, le=253_402_300_799, description="from this time")
]


@get(
    "/v1/jobs/{job_id:str}/logs",
    media_type="text/plain; charset=utf-8",
    responses=FOUND_ERRORS,
    tags=["jobs"],
)
async def job_logs(
    ctx: Ctx,
    caller: Who,
    job_id: PathName,
    attempt: Annotated[int | None, QueryParameter(ge=1, le=1_000_000)] = None,
    follow: Annotated[bool, QueryParameter(description="stream until the attempt ends")] = False,
    max_bytes: Annotated[int, QueryParameter(ge=1, le=64 << 20)] = logs.DEFAULT_MAX_BYTES,
    since: LogSince = None,
) -> Response[bytes] | Stream:
    """An attempt's output (default: the latest), every replica's, as the workload wrote it
    (lines prefixed `[replica N]` where there are several). `follow` streams it as it comes
    until the attempt ends; otherwise the last `max_bytes` of what there is. `since`: only
    what was shipped from that time on (the executor ships output every second or so)."""
    await _readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        job = await queries.job_detail(conn, job_id)
    if job is None:
        raise _fail(404, f"unknown job id {job_id!r}", "job_id")
    if job.attempt == 0:
        raise _fail(404, f"job {job_id!r} has not started yet ({job.state})", "attempt")
    wanted = attempt or job.attempt
    if wanted > job.attempt:
        raise _fail(404, f"job {job_id!r} has had {job.attempt} attempt(s), not {wanted}",
                    "attempt")  # fmt: skip

    async def over() -> bool:
        async with ctx.db.acquire() as conn:
            now = await queries.job_detail(conn, job_id)
        return now is None or now.attempt != wanted or now.state not in LIVE_STATES

    lines = logs.Lines(prefixed=job.replicas > 1)
    reader = ctx.host.output()
    output = logs.read_output(
        reader, job_id, wanted, lines, follow=follow, attempt_over=over, since=since
    )
    if not follow:
        return Response(await logs.tail(output, max_bytes), media_type="text/plain")
    return Stream(_held(ctx.streams.take(), output), media_type="text/plain")


#: The states in which an attempt may still write output.
LIVE_STATES: Final = frozenset({"starting", "running", "stopping"})


async def _held(place: Place, source: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """The stream, holding its place among the live streams; its consumer is closed as soon
    as the client goes."""
    try:
        async for chunk in source:
            yield chunk
    finally:
        place.give_back()
        await source.aclose()


@get("/v1/jobs/{job_id:str}/as-of/{seq:int}", responses=FOUND_ERRORS, tags=["timeline"])
async def job_as_of(
    ctx: Ctx,
    caller: Who,
    job_id: PathName,
    seq: Annotated[int, PathParameter(ge=1, le=1 << 62)],
) -> Job:
    """The job as it stood once the event at log position `seq` was applied."""
    await _readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        found = await queries.job_as_of(conn, job_id, seq)
    if found is None:
        raise _fail(404, f"job {job_id!r} did not exist at position {seq}", "job_id")
    return found


#: The event types a timeline may be filtered by.
EVENT_TYPES: Final = frozenset(t.__name__ for t in typing.get_args(AnyEvent))


@dataclass(frozen=True, slots=True)
class Window:
    """Which events of a timeline a request asks for: the same query parameters on every
    timeline route (a dependency, so they are declared, documented and checked once)."""

    types: list[str] | None
    since: float | None
    until: float | None
    after: int | None
    limit: int
    before: int | None = None
    newest: bool = False


Before = Annotated[
    int | None,
    QueryParameter(ge=1, le=1 << 62, description="only events before this log position"),
]
Newest = Annotated[
    bool,
    QueryParameter(
        description="the last `limit` events that match (still in log order) instead of the "
        "first; `next` is then the position to pass as `before` for the earlier ones"
    ),
]


def get_window(
    types: Types = None,
    since: Since = None,
    until: Until = None,
    after: After = None,
    limit: Limit = 100,
    before: Before = None,
    newest: Newest = False,
) -> Window:
    for name in types or ():
        if name not in EVENT_TYPES:
            raise _fail(400, f"unknown event type {name!r}", "type")
    return Window(types, since, until, after, limit, before, newest)


Span = NamedDependency[Window]


async def _timeline(ctx: Context, caller: Caller, window: Window, **about: str) -> TimelinePage:
    async with ctx.db.acquire() as conn:
        items, next_after = await queries.timeline(
            conn,
            **about,
            visible=caller.visible,
            types=window.types,
            since=window.since,
            until=window.until,
            after=window.after,
            limit=window.limit,
            before=window.before,
            newest=window.newest,
        )
    return TimelinePage(items=items, next=next_after)


AUDIT_ERRORS: Final = {
    **FOUND_ERRORS,
    422: ResponseSpec(Error, description="too long a log for the API (use `fairlane audit`)"),
}


@get("/v1/jobs/{job_id:str}/timeline", responses=AUDIT_ERRORS, tags=["timeline"])
async def job_timeline(
    ctx: Ctx,
    caller: Who,
    window: Span,
    job_id: PathName,
    rederive: Annotated[
        bool, QueryParameter(description="say of each decision whether the policy gives it")
    ] = False,
) -> TimelinePage:
    """A job's events in log order, each with its reason and the facts the policy used; with
    `rederive`, each decision also says what the policy, re-run on the state it was made
    from, gives (`rederived: matches`, or how it differs)."""
    await _readable_job(ctx, caller, job_id)
    page = await _timeline(ctx, caller, window, job=job_id)
    if not rederive:
        return page
    try:
        outcomes = await api_audit.outcomes_for_job(ctx.host.log, ctx.audits, job_id)
    except api_audit.TooLong as e:
        raise _fail(422, str(e), "rederive") from None
    items = [msgspec.structs.replace(e, rederived=outcomes.get(e.seq)) for e in page.items]
    return TimelinePage(items=items, next=page.next)


@get("/v1/audit", responses=AUDIT_ERRORS, tags=["timeline"])
async def audit_log(
    ctx: Ctx,
    caller: Who,
    first: Annotated[int, QueryParameter(name="from", ge=1, le=1 << 62)] = 1,
    last: Annotated[int | None, QueryParameter(name="to", ge=1, le=1 << 62)] = None,
    job: QueryName = None,
) -> dict[str, Any]:
    """Re-derive the decisions on the log (between positions `from` and `to`, about `job`):
    how many matched what the policy gives, and for each that did not, what the policy gives
    instead; as `fairlane audit -o json` prints it. The whole log needs an admin token; one
    job's decisions, a token covering its project."""
    if last is not None and last < first:
        raise _fail(400, f"to={last} is before from={first}: not a range of log positions", "to")
    if job is None:
        _admin(caller, "audit the whole log")
    else:
        await _readable_job(ctx, caller, job)
    try:
        return await api_audit.audit_log(ctx.host.log, ctx.audits, Scope(first, last, job))
    except api_audit.TooLong as e:
        raise _fail(422, str(e), "to") from None


@get("/v1/projects/{name:str}/timeline", responses=FOUND_ERRORS, tags=["timeline"])
async def project_timeline(ctx: Ctx, caller: Who, window: Span, name: PathName) -> TimelinePage:
    """The events of a project and of its jobs."""
    _may_read(caller, name)
    return await _timeline(ctx, caller, window, project=name)


@get("/v1/nodes/{name:str}/timeline", responses=ERRORS, tags=["timeline"])
async def node_timeline(ctx: Ctx, caller: Who, window: Span, name: PathName) -> TimelinePage:
    """The events of a node and of the jobs placed on it."""
    return await _timeline(ctx, caller, window, node=name)


@get("/v1/timeline", responses=ERRORS, tags=["timeline"])
async def whole_timeline(ctx: Ctx, caller: Who, window: Span) -> TimelinePage:
    """Every event, by type and between times."""
    return await _timeline(ctx, caller, window)


@get("/v1/projects", responses=ERRORS, tags=["projects"])
async def list_projects(ctx: Ctx, caller: Who) -> list[Project]:
    """Projects with their quota, fair share and usage per pool, and over-quota periods."""
    async with ctx.db.acquire() as conn:
        return await queries.projects(conn)


@get("/v1/projects/{name:str}", responses=FOUND_ERRORS, tags=["projects"])
async def get_project(ctx: Ctx, caller: Who, name: PathName) -> Project:
    async with ctx.db.acquire() as conn:
        found = await queries.projects(conn, name)
    if not found:
        raise _fail(404, f"unknown project {name!r}", "name")
    return found[0]


@get(
    "/v1/projects/{name:str}/as-of/{seq:int}",
    responses={**FOUND_ERRORS, 422: ResponseSpec(Error, description="too long a history")},
    tags=["timeline"],
)
async def project_as_of(
    ctx: Ctx,
    caller: Who,
    name: PathName,
    seq: Annotated[int, PathParameter(ge=1, le=1 << 62)],
) -> list[ProjectThen]:
    """A project's terms and usage per pool once the event at log position `seq` was applied."""
    _may_read(caller, name)
    async with ctx.db.acquire() as conn:
        try:
            found = await queries.project_as_of(conn, name, seq)
        except queries.TooLong as e:
            raise _fail(422, str(e), "seq") from None
    if not found:
        raise _fail(404, f"project {name!r} had no terms or usage by position {seq}", "name")
    return found


@get("/v1/pools", responses=ERRORS, tags=["pools"])
async def list_pools(ctx: Ctx, caller: Who) -> list[PoolView]:
    """Pools with their GPUs, free and allocated, and their queue."""
    async with ctx.db.acquire() as conn:
        return await queries.pools(conn)


@get("/v1/nodes", responses=ERRORS, tags=["nodes"])
async def list_nodes(ctx: Ctx, caller: Who) -> list[Node]:
    async with ctx.db.acquire() as conn:
        return await queries.nodes(conn)


@get("/v1/preemptions", responses=ERRORS, tags=["timeline"])
async def list_preemptions(
    ctx: Ctx,
    caller: Who,
    victim: QueryName = None,
    beneficiary: QueryName = None,
    after: After = None,
    limit: Limit = 100,
) -> list[Preemption]:
    """Preemptions that made room: victim, for whom, why, and the work lost."""
    async with ctx.db.acquire() as conn:
        items, _ = await queries.preemptions(
            conn,
            victim=victim,
            beneficiary=beneficiary,
            after=after,
            limit=limit,
            visible=caller.visible,
        )
    return items


@post(
    "/v1/tokens",
    status_code=201,
    responses={**ADMIN_ERRORS, 409: ResponseSpec(Error, description="the name is taken")},
    tags=["access"],
)
async def create_token(
    ctx: Ctx, caller: Who, request: Request[Any, Any, Any], data: JSONBody[TokenRequest]
) -> TokenCreated:
    """A new API token for some projects (admin). The token is shown only here."""
    data = await _strictly(request, TokenRequest)
    _admin(caller, "create tokens")
    expires_at = None if data.expires_in_s is None else time.time() + data.expires_in_s
    async with ctx.db.acquire() as conn:
        try:
            token = await tokens.create(conn, data.name, data.projects, data.admin, expires_at)
        except asyncpg.UniqueViolationError:
            raise _fail(409, f"a token named {data.name!r} exists", "name") from None
    return TokenCreated(data.name, token, sorted(set(data.projects)), data.admin, expires_at)


@get("/v1/tokens", responses=ADMIN_ERRORS, tags=["access"])
async def list_tokens(ctx: Ctx, caller: Who) -> list[TokenInfo]:
    """Every token's name, projects, expiry and creation time (admin); never the token."""
    _admin(caller, "list tokens")
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT name, projects, admin, expires_at, extract(epoch FROM created_at) AS created"
            " FROM api_tokens ORDER BY name"
        )
    return [
        TokenInfo(r["name"], list(r["projects"]), r["admin"], r["expires_at"], float(r["created"]))
        for r in rows
    ]


@delete(
    "/v1/tokens/{name:str}",
    status_code=200,
    responses={**ADMIN_ERRORS, 404: ResponseSpec(Error, description="no such token")},
    tags=["access"],
)
async def revoke_token(ctx: Ctx, caller: Who, name: PathName) -> TokenInfo:
    """Revoke a token (admin): it is refused from now on. The admin token is the cluster's
    own (kept in its file and installed again at each start): it is not revoked here."""
    _admin(caller, "revoke tokens")
    if name == tokens.ADMIN_NAME:
        raise _fail(422, "the admin token is the cluster's own: replace its file instead", "name")
    async with ctx.db.acquire() as conn:
        gone = await tokens.revoke(conn, name)
    if gone is None:
        raise _fail(404, f"no token named {name!r}", "name")
    return TokenInfo(gone.name, sorted(gone.projects), gone.admin, gone.expires_at)


@get("/v1/whoami", responses=ERRORS, tags=["access"])
async def whoami(caller: Who) -> Whoami:
    """Who the token is: its name, whether it is an admin token, its projects, its expiry."""
    return Whoami(caller.name, caller.admin, sorted(caller.projects), caller.expires_at)


@get("/v1/events", responses=FOUND_ERRORS, tags=["timeline"])
async def event_stream(
    ctx: Ctx,
    caller: Who,
    last_event_id: Annotated[
        str | None, HeaderParameter(name="Last-Event-ID", max_length=24)
    ] = None,
    after: After = None,
    job: QueryName = None,
) -> ServerSentEvent:
    """The live log as server-sent events (id: the stream sequence; event: the type). Resumes
    after `Last-Event-ID` (or `after`); without either, starts at the next event."""
    if last_event_id is not None:
        # ASCII digits and no more than a sequence can be (`isdigit` took "²", and a number
        # past the stream's 64-bit sequences had the reader retry five times a second)
        if re.fullmatch(r"[0-9]{1,19}", last_event_id) is None or int(last_event_id) > 1 << 62:
            raise _fail(400, "Last-Event-ID must be a sequence number from 0 to 2^62, got "
                        f"{last_event_id!r}", "Last-Event-ID")  # fmt: skip
        after = int(last_event_id)
    if job is not None:
        await _readable_job(ctx, caller, job)
    log_ = ctx.host.log
    start = (after + 1) if after is not None else (await log_.last_seq()) + 1
    # `>`: a node's report has its node after the event (`fl.job.<job>.<event>.<node>`)
    subject = f"fl.job.{job}.>" if job is not None else None
    seen = _Visibility(ctx, caller.visible)
    return ServerSentEvent(_stream(ctx.streams.take(), log_, start, subject, seen))


class _Visibility:
    """Whether a caller may see an event: every event for an admin; otherwise those of its
    projects and of their jobs, and those of no project (nodes, pools, the cluster). A job's
    project is learnt from its submission when the stream shows it, else read once."""

    def __init__(self, ctx: Context, visible: frozenset[str] | None) -> None:
        self.ctx = ctx
        self.visible = visible
        self.projects: dict[str, str | None] = {}  # job -> project

    async def shows(self, event: Event) -> bool:
        if isinstance(event, WorkRelayed):
            return False  # a copy of an event already shown, for one node's executor
        if self.visible is None:
            return True
        project = getattr(event, "project", None)
        job_id = getattr(event, "job_id", None)
        if isinstance(event, JobSubmitted):
            project = event.spec.project
        if job_id is not None:
            if project is not None:
                self.projects[job_id] = project
            elif job_id not in self.projects:
                if len(self.projects) > 100_000:  # bounded: a long stream forgets and asks again
                    self.projects.clear()
                async with self.ctx.db.acquire() as conn:
                    self.projects[job_id] = await queries.job_project(conn, job_id)
            project = self.projects[job_id]
            return project is not None and project in self.visible
        return project is None or project in self.visible


async def _stream(
    place: Place,
    log_: EventLog,
    start: int,
    subject: str | None,
    seen: _Visibility,
) -> AsyncGenerator[ServerSentEventMessage, None]:
    """The log from `start`, with a comment whenever it has been quiet for KEEP_ALIVE_S: it
    keeps proxies from closing the stream, and a client that has gone is noticed (the write
    fails) and its consumer closed, quiet log or not."""
    queue: asyncio.Queue[Stored] = asyncio.Queue(1000)
    reader = asyncio.create_task(_read_into(log_.follow(start, batch=500, subject=subject), queue))
    try:
        while True:
            try:
                async with asyncio.timeout(KEEP_ALIVE_S):
                    stored = await queue.get()
            except TimeoutError:
                if reader.done():
                    reader.result()  # its failure ends the stream
                yield ServerSentEventMessage(comment="keep-alive")
                continue
            if not await seen.shows(stored.event):
                continue
            yield ServerSentEventMessage(
                data=encode_event(stored.event).decode(),
                event=type(stored.event).__name__,
                id=stored.seq,
            )
    finally:
        place.give_back()
        await cancel_and_wait(reader)


async def _read_into(source: AsyncIterator[Stored], queue: asyncio.Queue[Stored]) -> None:
    try:
        async for stored in source:
            await queue.put(stored)
    finally:  # close the reader now (its consumer with it), not when it is collected
        close = getattr(source, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


@get("/v1/health", tags=["health"])
async def health(ctx: Ctx) -> Health:
    """How far the read models are: the last event projected, and the log's last."""
    async with ctx.db.acquire() as conn:
        projected = await queries.projected_seq(conn)
    return Health(projected_seq=projected, log_seq=await ctx.host.log.last_seq())


@get("/metrics", media_type="text/plain; version=0.0.4", include_in_schema=False)
async def prometheus(ctx: Ctx) -> bytes:
    log_seq = await ctx.host.log.last_seq()
    async with ctx.db.acquire() as conn:
        nodes = await queries.nodes(conn)
        gpu = await gpus.read(conn, ctx.host.gpu_samples(), nodes, lambda _: True)
        return await metrics.render(conn, log_seq, gpus.families(gpu))


# -- GPU samples ------------------------------------------------------------------------------


@get("/v1/gpus", responses=ERRORS, tags=["nodes"])
async def gpu_report(ctx: Ctx, caller: Who) -> gpus.GpuReport:
    """Every node's GPUs as last sampled (utilization, memory, temperature, power; None where
    unknown) with the job holding each, and each job's utilization and idle flag."""
    visible = caller.visible
    async with ctx.db.acquire() as conn:
        nodes = await queries.nodes(conn)
        return await gpus.read(
            conn, ctx.host.gpu_samples(), nodes, lambda p: visible is None or p in visible
        )


#: The most events the history route folds: it reads the whole timeline each time.
HISTORY_EVENTS_MAX: Final = 200_000


@get("/v1/history", responses=FOUND_ERRORS, tags=["projects"])
async def usage_history(
    ctx: Ctx,
    caller: Who,
    since: Since = None,
    until: Until = None,
    points: Annotated[int, QueryParameter(ge=2, le=history.POINTS_MAX)] = 60,
) -> history.History:
    """Each project's GPUs in use, quota and fair share per pool, and each pool's GPUs and
    GPUs allocated, at `points` evenly spaced times from `since` (default: the first event)
    to `until` (default: now), made again from the timeline."""
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT seq, data::text AS data FROM timeline ORDER BY seq LIMIT $1",
            HISTORY_EVENTS_MAX + 1,
        )
    if len(rows) > HISTORY_EVENTS_MAX:
        raise _fail(422, f"the log has more than {HISTORY_EVENTS_MAX} events: not yet drawn")
    events = [(r["seq"], decode_event(r["data"].encode())) for r in rows]
    first = events[0][1].time if events else time.time()
    start, end = since if since is not None else first, until if until is not None else time.time()
    if end <= start:
        raise _fail(400, "until must be after since", "until")
    visible = caller.visible
    shows = None if visible is None else set(visible)
    at = history.times(start, end, points)
    async with ctx.audits:  # one whole-log fold at a time, in a worker thread
        return await asyncio.to_thread(history.history, events, at, shows)


# -- the app ----------------------------------------------------------------------------------


def create_app(settings: Settings) -> Litestar:
    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        db = await connect_pool(settings.postgres_dsn, retry_for=60.0, max_size=8)
        async with db.acquire() as conn:
            await migrate(conn)
            if settings.admin_token_file is not None:
                token = tokens.admin_token_file(settings.admin_token_file)
                await tokens.install_admin(conn, token)
        nc = await connect(settings.nats_url, "api")
        app.state.ctx = Context(
            db=db,
            host=NatsHost(JetStreamLog(nc)),
            streams=StreamPlaces(settings.max_streams),
            node_runtime=settings.node_runtime,
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await nc.drain()
            await db.close()

    return Litestar(
        route_handlers=[
            submit_job,
            delete_job,
            pause_job,
            resume_job,
            update_job,
            set_project,
            set_pool,
            list_jobs,
            job_detail,
            job_logs,
            job_as_of,
            job_timeline,
            project_timeline,
            node_timeline,
            whole_timeline,
            audit_log,
            list_projects,
            get_project,
            project_as_of,
            list_pools,
            list_nodes,
            cordon_node,
            drain_node,
            uncordon_node,
            list_volumes,
            allow_volume,
            deny_volume,
            list_preemptions,
            create_token,
            list_tokens,
            revoke_token,
            whoami,
            event_stream,
            health,
            prometheus,
            gpu_report,
            usage_history,
            *dashboard_routes(),
            docs.docs_assets(),
        ],
        dependencies={
            "ctx": Provide(get_context, sync_to_thread=False),
            "caller": Provide(get_caller),
            "window": Provide(get_window, sync_to_thread=False),
        },
        exception_handlers={HTTPException: on_http_error, Exception: on_other_error},
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="Fairlane",
            version="1",
            description=__doc__,
            path="/docs",
            render_plugins=docs.pages(),
            components=Components(
                security_schemes={"BearerToken": SecurityScheme(type="http", scheme="bearer")}
            ),
            security=[{"BearerToken": []}],
        ),
    )
