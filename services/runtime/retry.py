"""One retry policy for what passes by itself: a server restarting or electing a leader, a
store that is full until space is made, a timeout, a service not answering yet.

Services wait and try again (with backoff, logged) instead of exiting: an idempotent write (its
event id deduplicates) can be retried safely, and so can a read. What does not pass by waiting
(a conflict, a refusal, a permission violation) is raised at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import nats.errors
import nats.js.errors
import structlog
from nats.js.errors import APIError

T = TypeVar("T")
log = structlog.get_logger("fairlane.retry")

#: Errors that pass when the server is back.
TRANSIENT: Final = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    # a publish answered 503: no stream leader just now (a cluster electing one, seen when
    # one node of three is killed)
    nats.js.errors.NoStreamResponseError,
    OSError,
)
#: JetStream errors that pass: the store is full (10077 "maximum bytes exceeded", 10047
#: storage resources, 10023 insufficient resources) until space is made, or the stream's
#: leader is being elected (10008 cluster not available), or a replicated stream has another
#: write fenced on the same subject in flight (10164: tried again, the write meets the fence
#: as it then is, and a fence that moved is the final 10071). Status 503 says the same.
TRANSIENT_JS_CODES: Final = frozenset({10077, 10047, 10023, 10008, 10164})


def is_transient(error: BaseException) -> bool:
    if isinstance(error, TRANSIENT):
        return True
    if isinstance(error, APIError):
        return error.code == 503 or error.err_code in TRANSIENT_JS_CODES
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Wait `first_wait_s`, doubling up to `max_wait_s`, for at most `give_up_after_s` (None:
    until it works, for a service that has nothing better to do)."""

    first_wait_s: float = 0.1
    max_wait_s: float = 2.0
    give_up_after_s: float | None = 300.0

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        what: str,
        retry_if: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """`attempt()` until it succeeds; an error `retry_if` accepts (by default a transient
        one) is retried, anything else raised (so is that one once `give_up_after_s` has
        passed)."""
        loop = asyncio.get_running_loop()
        deadline = None if self.give_up_after_s is None else loop.time() + self.give_up_after_s
        wait = self.first_wait_s
        while True:
            try:
                return await attempt()
            except Exception as e:
                if not retry_if(e) or (deadline is not None and loop.time() + wait > deadline):
                    raise
                log.warning("retrying", what=what, error=str(e) or repr(e), wait_s=wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.max_wait_s)


#: For writes a service must make (a decision, a report): keep trying for five minutes.
DURABLE: Final = RetryPolicy()
#: For answering a person: a few seconds, then say the cluster is unavailable.
PROMPT: Final = RetryPolicy(first_wait_s=0.02, max_wait_s=0.5, give_up_after_s=5.0)
#: For a service that cannot work at all without it (its first connection, its lease).
FOREVER: Final = RetryPolicy(max_wait_s=5.0, give_up_after_s=None)
