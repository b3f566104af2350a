"""The volume routes: the host folders jobs may mount, read from the log's last allowlist, and
changing it (admin).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from litestar import Request, delete, get, post
from litestar.params import JSONBody, QueryParameter

from events import VolumesConfigured, subject_for
from events.commands import AllowVolume, DenyVolume
from services.api.callers import Who, need_admin
from services.api.commands import send_command
from services.api.context import Ctx
from services.api.errors import ADMIN_ERRORS, ERRORS, strictly
from services.api.types import Accepted, VolumeAllowRequest, VolumeGrantView

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
    data = await strictly(request, VolumeAllowRequest)
    need_admin(caller, "allow volumes")
    command = AllowVolume(
        actor=caller.name, host_prefix=data.host_prefix, read_write=data.read_write
    )
    return await send_command(ctx, command)


@delete("/v1/volumes", status_code=200, responses=ADMIN_ERRORS, tags=["volumes"])
async def deny_volume(ctx: Ctx, caller: Who, prefix: HostPrefix) -> Accepted:
    """Take a host prefix off the allowlist (admin); jobs admitted before keep their mounts."""
    need_admin(caller, "deny volumes")
    return await send_command(ctx, DenyVolume(actor=caller.name, host_prefix=prefix))
