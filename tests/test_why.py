"""Why a job is pending: each reason where it applies, the first that applies winning."""

from __future__ import annotations

import dataclasses

from services.api.why import Standing, pending_reason

WAITING = Standing(
    state="pending", nominated=False, preemptible=True, gpus_wanted=8, pool="default",
    pool_free=4, project="a", usage=0, quota=4, limit=None, fair_share=4,
    last_preemption=("reclaim", "ws"),
)  # fmt: skip


def code(**changes: object) -> str | None:
    reason = pending_reason(dataclasses.replace(WAITING, **changes))  # type: ignore[arg-type]
    return None if reason is None else reason.code


def test_reasons_in_order() -> None:
    assert code() == "fair_share_reached"
    assert "preempted (reclaim, for ws)" in str(pending_reason(WAITING))
    assert code(fair_share=8) == "insufficient_gpus"
    assert code(pool_free=8) == "next_cycle"
    assert code(limit=6) == "project_limit"
    assert code(preemptible=False, pool_free=8, fair_share=8) == "non_preemptible_over_quota"
    assert code(nominated=True) == "gpus_being_freed"
    assert code(pool_free=None) == "no_pool"
    assert code(state="paused") == "paused"
    assert code(state="submitted") == "admission"
    assert code(state="stopping") == "stopping"
    assert code(state="running") is None
