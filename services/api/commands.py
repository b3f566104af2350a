"""Commands sent for a request: to admission or the ledger through the host, the reply turned
into the event it led to or an error with the status of its refusal code.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import asyncpg
import msgspec
import nats.errors
from litestar.exceptions import ServiceUnavailableException

from events import encode_event
from events.commands import AnyCommand
from services.api import queries
from services.api.callers import may_act
from services.api.context import Context
from services.api.errors import REFUSAL_STATUS, UNCODED_STATUS, fail
from services.api.tokens import Caller
from services.api.types import Accepted
from services.runtime.client import may_take_effect


async def send_command(ctx: Context, command: AnyCommand) -> Accepted:
    try:
        reply = await ctx.host.request(command)
    except msgspec.ValidationError as e:  # out of bounds (a negative quota): unsent
        at = re.search(r"`\$\.(\w+)", str(e))
        raise fail(400, str(e), at[1] if at else None) from None
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
    raise fail(status, reply.error or "refused", reply.field)


async def job_command(ctx: Context, caller: Caller, job_id: str, command: AnyCommand) -> Accepted:
    async with ctx.db.acquire() as conn:
        project = await queries.job_project(conn, job_id)
        if project is None and await _caught_up(ctx, conn):  # submitted a moment ago?
            project = await queries.job_project(conn, job_id)
    if project is None:
        raise fail(404, f"unknown job id {job_id!r}", "job_id")
    may_act(caller, project)
    return await send_command(ctx, command)


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
