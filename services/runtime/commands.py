"""Serving commands by NATS request/reply: decode, handle one at a time, always answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from events.commands import AnyCommand, Reply, decode_command
from policy.commands import Refused, decide_command
from services.runtime.eventlog import EventLog
from services.runtime.follower import Follower
from services.runtime.retry import is_transient

Handler = Callable[[AnyCommand], Awaitable[Reply]]
log = structlog.get_logger("fairlane.commands")
_encode = msgspec.json.Encoder().encode


#: How long a command waits for the log before it is answered "unavailable" (retryable): a
#: replicated stream that lost one server of three elects a new leader within seconds, and
#: a command sent meanwhile should then be carried out, not refused.
GIVE_UP_AFTER_S = 20.0


class Refusal(Exception):
    """A command that cannot be carried out; the message names the bad value."""


async def carry_out(
    log: EventLog,
    follower: Follower,
    command: AnyCommand,
    now: float,
    *,
    give_up_after: float = GIVE_UP_AFTER_S,
) -> Reply:
    """Decide `command` on the follower's state at time `now` (`policy.commands`), record the
    events it leads to, and answer once the follower has applied them."""
    outcome = decide_command(follower.state, command, now, follower.applied_seq)
    if isinstance(outcome, Refused):
        # a refusal may come of a view that lags the log ("unknown job" for a job admitted a
        # moment ago, while this service's reader was still catching up after a server
        # restart): it stands only once decided again on everything the log holds now
        last = await log.last_seq()
        if last > follower.applied_seq:
            await follower.wait_for(last, within=give_up_after)
            outcome = decide_command(follower.state, command, now, follower.applied_seq)
    if isinstance(outcome, Refused):
        raise Refusal(outcome.reason)
    seq = 0
    for event in outcome.events:
        seq = await log.publish_durably(event, give_up_after=give_up_after)
    await follower.wait_for(seq)
    return Reply(ok=True, event=outcome.answer)


async def answer(handler: Handler, command: AnyCommand) -> Reply:
    """The handler's reply, always one: a refusal, passing trouble (the same command may
    come again) and a failure are answered too."""
    try:
        return await handler(command)
    except Refusal as refused:
        return Reply(ok=False, error=str(refused))
    except Exception as e:  # answer, log, and keep serving
        if is_transient(e):  # the log is away or full: the same command may come again
            return Reply(ok=False, error=f"unavailable: {e!r}", retryable=True)
        log.exception("command failed", command=type(command).__name__)
        return Reply(ok=False, error=f"internal error: {e}")


async def serve(nc: Client, subject: str, handler: Handler, concurrency: int = 1) -> Subscription:
    """Answer every request on `subject`, at most `concurrency` at a time. With 1, strictly
    one after the other in arrival order, so two commands never decide from the same state;
    above 1, for a handler that guards what must not overlap itself."""
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    def finished(task: asyncio.Task[None]) -> None:
        running.discard(task)
        slots.release()

    async def on_request(msg: Msg) -> None:
        await slots.acquire()  # nats-py hands over the next request only once this returns
        task = asyncio.create_task(answer_request(msg))
        running.add(task)
        task.add_done_callback(finished)

    async def answer_request(msg: Msg) -> None:
        try:
            command = decode_command(msg.data)
        except msgspec.ValidationError as e:  # out of bounds: nothing was stored
            reply = Reply(ok=False, error=f"invalid command: {e}")
        except msgspec.DecodeError as e:
            reply = Reply(ok=False, error=f"malformed command: {e}")
        else:
            reply = await answer(handler, command)
        if msg.reply:
            await msg.respond(_encode(reply))

    return await nc.subscribe(subject, queue=subject, cb=on_request)
