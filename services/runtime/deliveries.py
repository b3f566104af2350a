"""A subscription whose messages go straight to a function, as the bytes the server sent.

nats-py hands each message of a subscription over in three steps: it parses its headers into
a dict, builds a `Msg`, and puts it on the subscription's queue, from which a task of its own
awaits the subscriber's callback, a turn of the event loop later. A reader of the log needs
none of it: a delivery's reply subject (the stream sequence) and its data are the event, and
the pull request's status messages are told apart by having no reply. So `Deliveries` takes
the messages of one subscription from nats-py's `Client._process_msg`, where its parser hands
each one over, and calls `deliver(subject, reply, data, headers)` there and then, in the task
that reads the socket. Every other subscription of the client goes the usual way.

This is the only module that reaches into how nats-py hands messages over (the client's
`_process_msg`, a subscription's `_id`); `tests/test_deliveries.py` fails if the pinned
nats-py changes either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import cast

from nats.aio.client import Client
from nats.aio.subscription import Subscription

#: What a delivery is handed to: subject, reply subject (b"" for none), data, and the raw
#: header block (None for none), as the server sent them.
Deliver = Callable[[bytes, bytes, bytes, bytes | None], None]
_ProcessMsg = Callable[[int, bytes, bytes, bytes, bytes | None], Awaitable[None]]


class Deliveries:
    """One subscription of `nc` whose messages are handed to `deliver` as they are parsed."""

    def __init__(self, nc: Client, sub: Subscription) -> None:
        self.nc, self.sub = nc, sub

    @classmethod
    async def subscribe(cls, nc: Client, subject: str, deliver: Deliver) -> Deliveries:
        # subscribed through nats-py, which sends it again to a server it reconnects to
        sub = await nc.subscribe(subject)
        _hand_over(nc).routes[sub._id] = deliver
        return cls(nc, sub)

    async def close(self) -> None:
        """No more deliveries (also when the connection is gone already)."""
        _hand_over(self.nc).routes.pop(self.sub._id, None)
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()


class _HandOver:
    """In the client's parser's place of `_process_msg`: a routed subscription's messages to
    its function, every other one the usual way."""

    def __init__(self, usual: _ProcessMsg, stats: dict[str, int]) -> None:
        self.usual, self.stats = usual, stats
        self.routes: dict[int, Deliver] = {}  # by subscription id

    async def __call__(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        deliver = self.routes.get(sid)
        if deliver is None:
            await self.usual(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        deliver(subject, reply, data, headers)


def _hand_over(nc: Client) -> _HandOver:
    """`nc`'s hand-over, put in place the first time it is asked for."""
    current = nc._process_msg
    if isinstance(current, _HandOver):
        return current
    # nats-py annotates `headers` as bytes; its parser passes None for a message without them
    hand_over = _HandOver(cast("_ProcessMsg", current), nc.stats)
    nc._process_msg = hand_over  # type: ignore[method-assign]
    return hand_over
