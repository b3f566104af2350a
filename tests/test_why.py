"""Why a job is pending: the policy's reason code, said with the read models' numbers."""

from __future__ import annotations

import dataclasses

from services.api.why import Standing, pending_reason

WAITING = Standing(
    state="pending", waiting="no_fit", preemptible=True, gpus_wanted=8, pool="default",
    pool_free=4, project="a", usage=0, quota=4, limit=None, fair_share=4,
    last_preemption=("reclaim", "ws"),
)  # fmt: skip


def said(**changes: object) -> tuple[str, str] | None:
    reason = pending_reason(dataclasses.replace(WAITING, **changes))  # type: ignore[arg-type]
    return None if reason is None else (reason.code, reason.message)


def code(**changes: object) -> str | None:
    words = said(**changes)
    return None if words is None else words[0]


def test_each_policy_code_has_its_words() -> None:
    assert code() == "fair_share_reached"
    assert code(fair_share=8) == "insufficient_gpus"
    assert code(waiting="") == "next_cycle"
    assert code(waiting="limit", limit=6) == "project_limit"
    assert code(waiting="quota", preemptible=False) == "non_preemptible_over_quota"
    assert code(waiting="nominated") == "gpus_being_freed"
    assert code(waiting="no_pool") == "no_pool"
    assert code(waiting="held") == "held"
    assert code(waiting="preemption_delay") == "preemption_delay"
    assert code(gpus_wanted=1, ports=("8888:8888",)) == "ports_taken"
    assert code(ports=("8888:8888",)) == "fair_share_reached"  # short of GPUs first


def test_the_numbers_and_the_last_preemption_are_in_the_message() -> None:
    words = said()
    assert words is not None
    assert "pool default has 4 free GPUs, the job needs 8" in words[1]
    assert "would hold 8, beyond its fair share of 4" in words[1]
    assert words[1].endswith("preempted (reclaim, for ws)")
    limit = said(waiting="limit", usage=4, limit=6)
    assert limit is not None and "4 GPUs in default; 8 more would pass its limit of 6" in limit[1]


def test_the_state_says_it_before_the_policy_does() -> None:
    assert code(state="paused") == "paused"
    assert code(state="submitted") == "admission"
    assert code(state="stopping") == "stopping"
    assert code(state="running") is None
