"""Sending commands to admission and the ledger, as the CLI and the API do."""

from __future__ import annotations

import time
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client

from events.commands import AnyCommand, Reply, check_bounds, decode_reply, service_subject
from services.runtime.retry import RetryPolicy

_encode = msgspec.json.Encoder().encode

#: The request header in which a sender says until when it waits for the answer (seconds
#: since the epoch): a command still waiting in line after that is not carried out, since
#: nobody would hear how it went (the sender has answered "unavailable" meanwhile). The
#: clocks of sender and service are taken to agree, as the events' own timestamps do.
DEADLINE_HEADER: Final = "Fairlane-Deadline"


def may_take_effect(command: AnyCommand) -> str:
    """What a sender is told when it cannot know whether `command` was carried out."""
    key = getattr(command, "idempotency_key", None)
    if key:
        return (
            "the command may still take effect: send it again with the same idempotency key "
            f"{key!r} to learn its outcome (it is carried out at most once)"
        )
    return "the command may still take effect: check whether it did before sending it again"


#: How long a sender waits for the answer: longer than the service waits for the log
#: (services/runtime/commands.py), so a slow answer still arrives.
WAIT_S = 25.0


async def send(nc: Client, command: AnyCommand, wait_s: float = WAIT_S) -> Reply:
    """Send a command to the service that owns it and return its answer.

    A command out of bounds raises msgspec.ValidationError naming the field, unsent.
    "No responders" means the request reached no one (the service is starting, or restarting
    after a crash), so sending it again cannot apply it twice: it is retried until `wait_s`.
    """
    check_bounds(command)
    subject = service_subject(command)
    payload = _encode(command)
    deadline = time.monotonic() + wait_s
    # the service skips the command if it is still waiting in line when this sender gives up
    headers = {DEADLINE_HEADER: f"{time.time() + wait_s:.3f}"}

    async def attempt() -> Reply:
        left = deadline - time.monotonic()
        msg = await nc.request(subject, payload, timeout=max(left, 0.001), headers=headers)
        return decode_reply(msg.data)

    def undelivered(e: BaseException) -> bool:  # a timeout may have been applied: not retried
        return isinstance(e, nats.errors.NoRespondersError)

    policy = RetryPolicy(first_wait_s=0.02, max_wait_s=0.5, give_up_after_s=wait_s)
    return await policy.run(attempt, type(command).__name__, retry_if=undelivered)
