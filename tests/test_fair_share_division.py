"""The integer fair-share division of DESIGN rule 1, on hand-computed cases."""

from __future__ import annotations

from policy.fair_share import Claim, divide


def claim(
    name: str, order: int, quota: int = 0, weight: int = 1, prio: int = 100, demand: int = 100
) -> Claim:
    return Claim(name, order, quota, weight, prio, demand)


def test_quota_first_then_weights() -> None:
    # 10 GPUs, no quotas, weights 1:2:1 -> 2.5 / 5 / 2.5; one leftover GPU to the older of the .5s
    shares = divide(10, [claim("a", 0), claim("b", 1, weight=2), claim("c", 2)])
    assert shares == {"a": 3, "b": 5, "c": 2}


def test_capped_projects_give_back_to_the_rest() -> None:
    # b wants 1: capped; 9 left for a and c -> 4.5 each -> 4 + 4, leftover to older a
    shares = divide(10, [claim("a", 0), claim("b", 1, demand=1), claim("c", 2)])
    assert shares == {"a": 5, "b": 1, "c": 4}


def test_priority_buckets_are_strict() -> None:
    shares = divide(8, [claim("hi", 1, prio=200, demand=6), claim("lo", 0, demand=8)])
    assert shares == {"hi": 6, "lo": 2}


def test_weight_zero_gets_only_its_quota() -> None:
    shares = divide(8, [claim("a", 0, quota=2, weight=0), claim("b", 1, demand=3)])
    assert shares == {"a": 2, "b": 3}


def test_quota_is_capped_by_demand() -> None:
    shares = divide(8, [claim("a", 0, quota=6, demand=1), claim("b", 1, quota=2)])
    assert shares == {"a": 1, "b": 7}


def test_largest_remainder_beats_age() -> None:
    # 7 GPUs, weights 1:1:2 -> 1.75 / 1.75 / 3.5 -> 1 / 1 / 3, two leftovers: .75, .75 (a, b)
    shares = divide(7, [claim("a", 0), claim("b", 1), claim("c", 2, weight=2)])
    assert shares == {"a": 2, "b": 2, "c": 3}


def test_never_more_than_the_pool() -> None:
    shares = divide(5, [claim("a", 0, quota=4), claim("b", 1, quota=4)])
    assert sum(shares.values()) <= 8
    assert shares == {"a": 4, "b": 4}
