"""How far the read models are (`/v1/health`) and the Prometheus metrics (`/metrics`)."""

from __future__ import annotations

from litestar import get

from services.api import gpus, metrics, queries
from services.api.context import Ctx
from services.api.types import Health


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
