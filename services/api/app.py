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

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from services.api import (
    access,
    docs,
    health,
    job_output,
    jobs,
    live,
    nodes,
    projects,
    timelines,
    tokens,
    volumes,
)
from services.api.callers import get_caller
from services.api.context import Context, Settings, get_context
from services.api.errors import MAX_BODY_BYTES, on_http_error, on_other_error
from services.api.streams import StreamPlaces
from services.api.timelines import get_window
from services.api.ui import dashboard_routes
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.host import NatsHost
from services.runtime.postgres import connect_pool, migrate

__all__ = ["Settings", "create_app"]


def create_app(settings: Settings) -> Litestar:
    return Litestar(
        route_handlers=[*_routes(), *dashboard_routes(), docs.docs_assets()],
        dependencies={
            "ctx": Provide(get_context, sync_to_thread=False),
            "caller": Provide(get_caller),
            "window": Provide(get_window, sync_to_thread=False),
        },
        exception_handlers={HTTPException: on_http_error, Exception: on_other_error},
        request_max_body_size=MAX_BODY_BYTES,
        lifespan=[_lifespan(settings)],
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


def _routes() -> Sequence[Callable[..., Any]]:
    """The api's own routes, in the order the schema lists them."""
    return [
        jobs.submit_job,
        jobs.delete_job,
        jobs.pause_job,
        jobs.resume_job,
        jobs.update_job,
        projects.set_project,
        projects.set_pool,
        jobs.list_jobs,
        jobs.job_detail,
        job_output.job_logs,
        jobs.job_as_of,
        timelines.job_timeline,
        timelines.project_timeline,
        timelines.node_timeline,
        timelines.whole_timeline,
        timelines.audit_log,
        projects.list_projects,
        projects.get_project,
        projects.project_as_of,
        projects.list_pools,
        nodes.list_nodes,
        nodes.cordon_node,
        nodes.drain_node,
        nodes.uncordon_node,
        volumes.list_volumes,
        volumes.allow_volume,
        volumes.deny_volume,
        timelines.list_preemptions,
        access.create_token,
        access.list_tokens,
        access.revoke_token,
        access.whoami,
        live.event_stream,
        health.health,
        health.prometheus,
        nodes.gpu_report,
        projects.usage_history,
    ]


def _lifespan(
    settings: Settings,
) -> Callable[[Litestar], contextlib.AbstractAsyncContextManager[None]]:
    """The read models' pool (migrated, the admin token installed) and the bus, for the app's
    life: its context is made here."""

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

    return lifespan
