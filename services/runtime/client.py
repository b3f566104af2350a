"""Sending commands to admission and the ledger, as the CLI and the API do."""

from __future__ import annotations

import time

import msgspec
import nats.errors
from nats.aio.client import Client

from events.commands import AnyCommand, Reply, check_bounds, decode_reply, service_subject
from services.runtime.retry import RetryPolicy

_encode = msgspec.json.Encoder().encode


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

    async def attempt() -> Reply:
        left = deadline - time.monotonic()
        msg = await nc.request(subject, payload, timeout=max(left, 0.001))
        return decode_reply(msg.data)

    def undelivered(e: BaseException) -> bool:  # a timeout may have been applied: not retried
        return isinstance(e, nats.errors.NoRespondersError)

    policy = RetryPolicy(first_wait_s=0.02, max_wait_s=0.5, give_up_after_s=wait_s)
    return await policy.run(attempt, type(command).__name__, retry_if=undelivered)
