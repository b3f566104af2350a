"""Serving commands by NATS request/reply: decode, handle one at a time, always answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Final

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import APIError

from events.commands import AnyCommand, Reply, decode_command
from policy.commands import Refused, decide_command
from services.runtime.client import DEADLINE_HEADER, may_take_effect
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
#: How long before the sender's deadline a service stops waiting on the log, to answer in time.
ANSWER_MARGIN_S: Final = 1.0
_deadline: ContextVar[float | None] = ContextVar("fairlane_command_deadline", default=None)


class CommandRefused(Exception):
    """A command that cannot be carried out, and why (`policy.commands.Refused`)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.reason)
        self.refused = refused


class MayTakeEffect(Exception):
    """The log did not answer a write of this command in time (the write may have landed,
    or land yet), or took some of its events: the command may still take effect."""

    def __init__(self, command: AnyCommand, cause: BaseException) -> None:
        super().__init__(f"unavailable: {cause!r}; {may_take_effect(command)}")


def time_left(give_up_after: float = GIVE_UP_AFTER_S) -> float:
    """How long to wait on the log for the command being answered: `give_up_after`, or less,
    to answer before its sender stops listening."""
    deadline = _deadline.get()
    if deadline is None:
        return give_up_after
    return max(0.0, min(give_up_after, deadline - time.time() - ANSWER_MARGIN_S))


def outcome_unknown(error: BaseException) -> bool:
    """A write that failed so may have been stored (no answer came): not one the server
    refused outright, nor one that reached no server."""
    refused = nats.errors.NoRespondersError | APIError
    return is_transient(error) and not isinstance(error, refused)


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
        raise CommandRefused(outcome)
    give_up_after = time_left(give_up_after)  # answer before the sender stops listening
    seq = 0
    for i, event in enumerate(outcome.events):
        try:
            seq = await log.publish_durably(event, give_up_after=give_up_after)
        except Exception as e:
            # nothing is written only if this was the first event and the server refused it
            if is_transient(e) and (i > 0 or outcome_unknown(e)):
                raise MayTakeEffect(command, e) from e
            raise
    try:
        await follower.wait_for(seq)
    except Exception as e:  # written, not yet read back: it took effect
        if is_transient(e):
            raise MayTakeEffect(command, e) from e
        raise
    return Reply(ok=True, event=outcome.answer)


async def answer(handler: Handler, command: AnyCommand) -> Reply:
    """The handler's reply, always one: a refusal, passing trouble (the same command may
    come again) and a failure are answered too."""
    try:
        return await handler(command)
    except CommandRefused as no:
        refused = no.refused
        return Reply(ok=False, error=refused.reason, code=refused.code, field=refused.field)
    except MayTakeEffect as maybe:
        return Reply(ok=False, error=str(maybe), retryable=True)
    except Exception as e:  # answer, log, and keep serving
        if is_transient(e):  # the log is away or full, nothing was written: send it again
            return Reply(ok=False, error=f"unavailable: {e!r}; nothing was written", retryable=True)
        log.exception("command failed", command=type(command).__name__)
        return Reply(ok=False, error=f"internal error: {e}")


EXPIRED: Final = (
    "unavailable: not carried out, nothing was written: it waited behind other commands past "
    "the time its sender waits for the answer; send it again"
)


def _sender_deadline(msg: Msg) -> float | None:
    try:
        return float((msg.headers or {})[DEADLINE_HEADER])
    except (KeyError, ValueError):
        return None


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
            deadline = _sender_deadline(msg)
            if deadline is not None and time.time() > deadline - ANSWER_MARGIN_S:
                reply = Reply(ok=False, error=EXPIRED, retryable=True)
            else:
                _deadline.set(deadline)  # (this task's own context)
                reply = await answer(handler, command)
        if msg.reply:
            await msg.respond(_encode(reply))

    return await nc.subscribe(subject, queue=subject, cb=on_request)
