"""Writing to a JetStream stream and awaiting the server's ack, for a fraction of nats-py's CPU.

nats-py's `JetStream.publish` is a request: a random token per write (a system call), a
future with a callback, `asyncio.wait_for`, the ack parsed into a `Msg` (its headers too) and
queued for a task of its own before the future is resolved a turn of the event loop later,
then `json.loads` and a dataclass built field by field. Every service writes an event for
every decision, and every one of those costs that (about 70 µs of CPU a write here). A
`Publisher` gives each write a reply subject under one subscription of its own whose acks
are handed over as the socket is read (`services/runtime/deliveries.py`): a counter for the
token, one future, the ack decoded by msgspec.

What a caller sees is nats-py's: the same errors for the same answers (`APIError` and its
kinds from the ack's `error`, `NoStreamResponseError` for a write no stream took, nats-py's
`TimeoutError`), so the retry policy and the fences read them as before.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.errors import APIError

from services.runtime.deliveries import Deliveries

#: The status a server answers a request with when nothing listens on its subject.
NO_RESPONDERS: bytes = b"503"


class _Error(msgspec.Struct):
    code: int
    err_code: int | None = None
    description: str | None = None


class _Ack(msgspec.Struct):
    """A JetStream ack: the stream and sequence the write was stored at, or why not."""

    stream: str = ""
    seq: int = 0
    duplicate: bool | None = None
    error: _Error | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


class Publisher:
    """Writes on `nc`, each awaited until the server acks it."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._deliveries: Deliveries | None = None
        self._prefix = ""
        self._waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self._tokens = itertools.count(1)

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, Any], wait_s: float = 5.0
    ) -> int:
        """Store `payload` on `subject`; the stream sequence it was stored at (the original's
        for a duplicate of its `Nats-Msg-Id`), or nats-py's TimeoutError after `wait_s`."""
        if self._deliveries is None:
            self._prefix = self.nc.new_inbox()
            self._deliveries = await Deliveries.subscribe(self.nc, f"{self._prefix}.*", self._ack)
        reply = f"{self._prefix}.{next(self._tokens)}"
        key = reply.encode()
        waiting: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiting
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=headers)
            try:
                async with asyncio.timeout(wait_s):
                    answer = await waiting
            except TimeoutError:
                raise nats.errors.TimeoutError from None
        finally:
            del self._waiting[key]
        return _stored_at(answer)

    def _ack(self, subject: bytes, _reply: bytes, data: bytes, headers: bytes | None) -> None:
        waiting = self._waiting.get(subject)
        if waiting is None or waiting.done():
            return  # given up on (a timeout), or a stray answer
        if not data and headers is not None and _status(headers) == NO_RESPONDERS:
            waiting.set_exception(nats.js.errors.NoStreamResponseError())
            return
        waiting.set_result(data)

    async def close(self) -> None:
        if self._deliveries is not None:
            await self._deliveries.close()
            self._deliveries = None


def _status(headers: bytes) -> bytes:
    """The status code of a header block's first line (`NATS/1.0 503`), or b""."""
    first = headers.split(b"\r\n", 1)[0]
    parts = first.split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


def _stored_at(answer: bytes) -> int:
    try:
        ack = _decode_ack(answer)
    except msgspec.DecodeError:
        raise APIError(description=f"not a JetStream ack: {answer[:200]!r}") from None
    if ack.error is not None:
        nats.js.errors.APIError.from_error(msgspec.structs.asdict(ack.error))
    return ack.seq
