"""The integer fair-share division of rule 1 (docs/rules.md), on hand-computed cases."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policy.division import Claim, divide


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


def test_quotas_beyond_the_pool_are_never_cut_down() -> None:
    # quotas 4 + 4 on 5 GPUs: each keeps min(quota, demand), and nothing is left to divide
    shares = divide(5, [claim("a", 0, quota=4), claim("b", 1, quota=4)])
    assert shares == {"a": 4, "b": 4}
    # whatever the project priorities: the first step is not a division
    shares = divide(
        6, [claim("lo", 0, quota=4), claim("hi", 1, quota=4, prio=200), claim("mid", 2, quota=4)]
    )
    assert shares == {"hi": 4, "lo": 4, "mid": 4}


def test_kai_s27_quotas_1_1_2_2_on_four_gpus() -> None:
    # KAI's S-27: four 1-GPU nodes, quotas 1 + 1 + 2 + 2 with demand beyond them: each share
    # is its quota (6 in all on a 4-GPU pool), so each project may still preempt its own
    # lower-priority work up to its quota
    shares = divide(
        4,
        [
            claim("q1", 0, quota=1, demand=2),
            claim("q2", 1, quota=1, demand=2),
            claim("q3", 2, quota=2, demand=3),
            claim("q4", 3, quota=2, demand=3),
        ],
    )
    assert shares == {"q1": 1, "q2": 1, "q3": 2, "q4": 2}


def test_rounding_is_settled_inside_each_level_capping_first() -> None:
    # level 200: 9 GPUs between hi1 (wants 2) and hi2 (wants 20), equal weights: 4.5 each
    # covers hi1's demand, so hi1 is capped at 2 before anyone is rounded down and hi2 gets 7;
    # the level's rounding leaves nothing for level 100
    shares = divide(
        9,
        [claim("hi1", 0, prio=200, demand=2), claim("hi2", 1, prio=200, demand=20), claim("lo", 2)],
    )
    assert shares == {"hi1": 2, "hi2": 7, "lo": 0}
    # 3 GPUs, weights 1:1:1 inside level 200 -> 1 each; 7 GPUs -> 2.33 each: 2/2/2 and the
    # leftover GPU to the older project of that level, before level 100 sees any
    shares = divide(
        7,
        [
            claim("x", 3, prio=200, demand=9),
            claim("y", 1, prio=200, demand=9),
            claim("z", 2, prio=200, demand=9),
            claim("lo", 0),
        ],
    )
    assert shares == {"x": 2, "y": 3, "z": 2, "lo": 0}


claims_strategy = st.lists(
    st.builds(
        lambda quota, weight, prio, demand: (quota, weight, prio, demand),
        st.integers(0, 8),
        st.integers(0, 3),
        st.sampled_from([50, 100, 200]),
        st.integers(0, 16),
    ),
    min_size=1,
    max_size=6,
)


@given(capacity=st.integers(0, 40), drawn=claims_strategy)
def test_division_properties(capacity: int, drawn: list[tuple[int, int, int, int]]) -> None:
    claims = [
        claim(f"p{i}", i, quota=q, weight=w, prio=p, demand=d)
        for i, (q, w, p, d) in enumerate(drawn)
    ]
    shares = divide(capacity, claims)
    assert set(shares) == {c.project for c in claims}
    assert all(0 <= shares[c.project] <= c.demand for c in claims), "share above demand"
    owed = {c.project: min(c.quota, c.demand) for c in claims}
    # quota first, never cut down (even where the quotas outgrow the pool)
    assert all(shares[c.project] >= owed[c.project] for c in claims), "quota not first"
    # above quota only what the pool has beyond the quotas
    assert sum(shares.values()) <= max(capacity, sum(owed.values())), "more than the pool"
    if sum(owed.values()) >= capacity:
        assert shares == owed, "a share above quota where nothing was left to divide"
    # weight 0 gets nothing above quota; the pool is used while anyone with a weight wants
    # more
    for c in claims:
        if c.weight == 0:
            assert shares[c.project] == owed[c.project], "weight 0 above quota"
    hungry = [c for c in claims if c.weight > 0 and shares[c.project] < c.demand]
    if hungry:
        assert sum(shares.values()) >= capacity, "GPUs left while someone wants them"
    # strict priority buckets: above quota at a lower priority only once every project with
    # a weight at a higher priority has all it wants
    for low in claims:
        if shares[low.project] > owed[low.project]:
            for high in claims:
                if high.priority > low.priority and high.weight > 0:
                    assert shares[high.project] == high.demand, "priority not strict"
