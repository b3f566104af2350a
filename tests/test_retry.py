"""The one retry policy: what passes by waiting is retried, what does not is raised at once."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from services.runtime.eventlog import Conflict
from services.runtime.retry import RetryPolicy, is_transient


def test_what_passes_by_itself_is_transient() -> None:
    assert is_transient(nats.js.errors.NoStreamResponseError())  # a stream electing a leader
    assert is_transient(nats.errors.TimeoutError())
    full = nats.js.errors.APIError(code=400, err_code=10077, description="maximum bytes")
    assert is_transient(full)
    assert not is_transient(nats.js.errors.APIError(code=400, err_code=10071))  # wrong seq
    assert not is_transient(Conflict("fenced"))
    assert not is_transient(ValueError("bad input"))


async def test_a_transient_failure_is_retried_and_a_final_one_is_not() -> None:
    tries: list[str] = []

    async def flaky() -> str:
        tries.append("try")
        if len(tries) < 3:
            raise nats.js.errors.NoStreamResponseError
        return "stored"

    policy = RetryPolicy(first_wait_s=0.001, max_wait_s=0.002, give_up_after_s=5.0)
    assert await policy.run(flaky, "publish") == "stored" and len(tries) == 3

    async def refused() -> str:
        tries.append("refused")
        raise Conflict("the fence moved on")

    with pytest.raises(Conflict):
        await policy.run(refused, "publish")
    assert tries.count("refused") == 1
