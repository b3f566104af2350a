"""The node routes: cordon, drain and uncordon (commands, admin), the nodes as the read models hold
them, and their GPUs as last sampled.
"""

from __future__ import annotations

from litestar import get, post
from litestar.params import JSONBody

from events.commands import CordonNode, UncordonNode
from services.api import gpus, queries
from services.api.callers import Who, need_admin
from services.api.commands import send_command
from services.api.context import Ctx
from services.api.errors import ADMIN_ERRORS, ERRORS
from services.api.params import PathName
from services.api.types import Accepted, Node, NodeServiceRequest


@post("/v1/nodes/{name:str}/cordon", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def cordon_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Cordon a node (admin): it takes no new work; what runs there keeps running."""
    need_admin(caller, "cordon nodes")
    reason = data.reason if data is not None else ""
    return await send_command(ctx, CordonNode(actor=caller.name, node=name, reason=reason))


@post("/v1/nodes/{name:str}/drain", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def drain_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Drain a node (admin): it takes no new work, and its jobs checkpoint, stop (reason
    `drain` on their timeline) and are placed elsewhere by the usual rules."""
    need_admin(caller, "drain nodes")
    reason = data.reason if data is not None else ""
    command = CordonNode(actor=caller.name, node=name, drain=True, reason=reason)
    return await send_command(ctx, command)


@post("/v1/nodes/{name:str}/uncordon", status_code=200, responses=ADMIN_ERRORS, tags=["nodes"])
async def uncordon_node(
    ctx: Ctx, caller: Who, name: PathName, data: JSONBody[NodeServiceRequest | None] = None
) -> Accepted:
    """Put a cordoned or drained node back in service (admin)."""
    need_admin(caller, "uncordon nodes")
    reason = data.reason if data is not None else ""
    return await send_command(ctx, UncordonNode(actor=caller.name, node=name, reason=reason))


@get("/v1/nodes", responses=ERRORS, tags=["nodes"])
async def list_nodes(ctx: Ctx, caller: Who) -> list[Node]:
    async with ctx.db.acquire() as conn:
        return await queries.nodes(conn)


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
