"""Fair share: how many whole GPUs each project of a pool is entitled to right now.

DESIGN.md, rule 1: every project first gets min(quota, demand). What is left goes to projects
with unmet demand, higher project priority first (strictly), and inside one priority in proportion
to over_quota_weight, in whole GPUs, capped by demand, repeating while some project was capped.
GPUs left over by rounding go one at a time to the largest fractional remainder, then to the
older project. Weight 0 gets nothing above quota. Where quotas (capped by demand) add up to more
than the pool, the pool is shared out in quota order instead (see _quotas_oversubscribed): the
shares never add up to more than the pool holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True, slots=True)
class Claim:
    """One project's standing in a pool, as the division needs it."""

    project: str
    order: int  # lower is older
    quota: int
    weight: int
    priority: int
    demand: int  # held + pending, already capped by the project's limit


def divide(capacity: int, claims: list[Claim]) -> dict[str, int]:
    share = {c.project: min(c.quota, c.demand) for c in claims}
    if sum(share.values()) > capacity:
        return _quotas_oversubscribed(capacity, claims, share)
    remaining = capacity - sum(share.values())
    for priority in sorted({c.priority for c in claims}, reverse=True):
        if remaining <= 0:
            break
        bucket = [
            c
            for c in claims
            if c.priority == priority and c.weight > 0 and share[c.project] < c.demand
        ]
        remaining = _water_fill(remaining, bucket, share)
    return share


def _quotas_oversubscribed(
    capacity: int, claims: list[Claim], owed: dict[str, int]
) -> dict[str, int]:
    """Quotas (capped by demand) add up to more than the pool holds (nodes were lost, or
    quotas were promised beyond it): no share is above quota, and the pool is divided in quota
    order: higher project priority first (strictly); inside the level that no longer gets all
    it is owed, in proportion to what each is owed, rounded like the rest of the division."""
    share = dict.fromkeys(owed, 0)
    remaining = capacity
    for priority in sorted({c.priority for c in claims}, reverse=True):
        level = [c for c in claims if c.priority == priority and owed[c.project] > 0]
        wanted = sum(owed[c.project] for c in level)
        if wanted <= remaining:
            for c in level:
                share[c.project] = owed[c.project]
            remaining -= wanted
            continue
        exact = {c.project: Fraction(remaining * owed[c.project], wanted) for c in level}
        for c in level:
            share[c.project] = int(exact[c.project])
        leftover = remaining - sum(share[c.project] for c in level)
        by_remainder = sorted(level, key=lambda c: (-(exact[c.project] % 1), c.order))
        for c in by_remainder[:leftover]:
            share[c.project] += 1
        break
    return share


def _water_fill(remaining: int, bucket: list[Claim], share: dict[str, int]) -> int:
    active = list(bucket)
    while active and remaining > 0:
        total_weight = sum(c.weight for c in active)
        exact = {c.project: Fraction(remaining * c.weight, total_weight) for c in active}
        capped = [c for c in active if exact[c.project] >= c.demand - share[c.project]]
        if capped:
            for c in capped:
                remaining -= c.demand - share[c.project]
                share[c.project] = c.demand
            active = [c for c in active if c not in capped]
            continue
        given = 0
        for c in active:
            whole = int(exact[c.project])
            share[c.project] += whole
            given += whole
        leftover = remaining - given
        by_remainder = sorted(
            active, key=lambda c: (-(exact[c.project] - int(exact[c.project])), c.order)
        )
        for c in by_remainder[:leftover]:
            share[c.project] += 1
        return remaining - given - min(leftover, len(by_remainder))
    return remaining
