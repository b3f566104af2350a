"""Sending commands to admission and the ledger, as the CLI and the API do."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats.errors
from nats.aio.client import Client

from events.commands import AnyCommand, Reply, decode_reply, service_subject

_encode = msgspec.json.Encoder().encode


async def send(nc: Client, command: AnyCommand, wait_s: float = 10.0) -> Reply:
    """Send a command to the service that owns it and return its answer.

    "No responders" means the request reached no one (the service is starting, or restarting
    after a crash), so sending it again cannot apply it twice: it is retried until `wait_s`.
    """
    subject = service_subject(command)
    payload = _encode(command)
    deadline = time.monotonic() + wait_s
    pause_s = 0.02
    while True:
        left = deadline - time.monotonic()
        try:
            msg = await nc.request(subject, payload, timeout=max(left, 0.001))
            return decode_reply(msg.data)
        except nats.errors.NoRespondersError:
            if time.monotonic() + pause_s >= deadline:
                raise
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.5)
