"""The policy cycle bench's comparison with a git revision: the same states, decided by the
policy there and here, each in a child process, with each plan's fingerprint compared."""

from __future__ import annotations

import pytest

from bench import policy_cycle
from bench.policy_cycle import NOW, Size, build
from policy.cycle import decide

TINY = Size(nodes=4, running=10, pending=20)
OPTIONS = {"seed": 7, "settled": True, "burst": True}


def test_against_head_times_both_trees_and_finds_the_same_plans() -> None:
    paired = policy_cycle.against("HEAD", [1], 1, OPTIONS, base=TINY)
    assert [(p.scale, p.cycle) for p in paired] == [(1, "burst"), (1, "settled")]
    burst = paired[0]
    assert burst.decisions > 0 and burst.before.decisions == burst.decisions
    assert all(p.same_plan and len(p.after.plan_sha256) == 64 for p in paired)
    assert all(p.before.p50_ms > 0 and p.after.p50_ms > 0 for p in paired)
    assert all(p.before.cpu_p50_ms > 0 and p.after.cpu_p50_ms > 0 for p in paired)


def test_a_revision_git_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--baseline: 'no-such-revision'"):
        policy_cycle.against("no-such-revision", [1], 1, OPTIONS, base=TINY)


def test_the_fingerprint_tells_plans_apart() -> None:
    one = decide(build(TINY, seed=1).state, NOW)
    again = decide(build(TINY, seed=1).state, NOW)
    other = decide(build(TINY, seed=2).state, NOW)
    assert policy_cycle.plan_sha256(one) == policy_cycle.plan_sha256(again)
    assert policy_cycle.plan_sha256(one) != policy_cycle.plan_sha256(other)
