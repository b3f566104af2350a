"""Fair share: how many whole GPUs each project of a pool is entitled to right now.

Rule 1 (docs/rules.md): every project first gets min(quota, demand). What is left goes to projects
with unmet demand, higher project priority first (strictly), and inside one priority in proportion
to over_quota_weight, in whole GPUs, capped by demand, repeating while some project was capped.
GPUs left over by rounding go one at a time to the largest fractional remainder, then to the
older project. Weight 0 gets nothing above quota. The first step is never cut down: where
quotas (capped by demand) add up to more than the pool, the shares do too, as in KAI.
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
    # min(quota, demand) is never cut down, even when those add up to more than the pool:
    # a project then still preempts its own lower-priority work up to its quota (KAI's S-27),
    # which a proportional cut would forbid; there is simply nothing left to divide.
    share = {c.project: min(c.quota, c.demand) for c in claims}
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
