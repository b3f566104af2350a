"""Fair share: how many whole GPUs each project of a pool is entitled to right now.

Rule 1 (docs/rules.md): every project first gets min(quota, demand). What is left goes to projects
with unmet demand, higher project priority first (strictly), and inside one priority in proportion
to over_quota_weight, in whole GPUs, capped by demand, repeating while some project was capped.
GPUs left over by rounding go one at a time to the largest fractional remainder, then to the
older project. Weight 0 gets nothing above quota. The first step is never cut down: where
quotas (capped by demand) add up to more than the pool, the shares do too, as in KAI.

Rule 11 (a pool with a usage half-life) changes only the division above quota: inside a
priority level each round gives project i the part P_i / sum(P) of what is left, where
P_i = max(0, W_i + k * (W_i - U_i)), W_i its weight over the weights of the projects still
unsatisfied in that round and U_i its decayed usage (policy/decay.py). Without a `History`
the division is the weights' alone, on the same code path as before.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True, slots=True)
class History:
    """Rule 11: each project's decayed usage U (0 when not given) and the pool's k."""

    usage: Mapping[str, float]
    k: float


def divide(
    capacity: int,
    claims: list[Claim],
    history: History | None = None,
    weights: dict[str, Fraction] | None = None,
) -> dict[str, int]:
    """Each project's fair share. With a `history` (rule 11), `weights` (if given) receives
    each project's P from the last round it took part in."""
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
        remaining = _water_fill(remaining, bucket, share, history, weights)
    return share


def _water_fill(
    remaining: int,
    bucket: list[Claim],
    share: dict[str, int],
    history: History | None = None,
    weights: dict[str, Fraction] | None = None,
) -> int:
    active = list(bucket)
    while active and remaining > 0:
        if history is None:
            total_weight = sum(c.weight for c in active)
            exact = {c.project: Fraction(remaining * c.weight, total_weight) for c in active}
        else:
            exact = _by_history(remaining, active, history, weights)
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


def _by_history(
    remaining: int, active: list[Claim], history: History, weights: dict[str, Fraction] | None
) -> dict[str, Fraction]:
    """One round of rule 11: each active project's exact part of `remaining`, in proportion to
    P_i = max(0, W_i + k * (W_i - U_i)). Exact rationals (a float U or k is taken as the
    exact number it is), so k = 0 gives the weights' own parts exactly and the rounding after
    is the weights' own."""
    total_weight = sum(c.weight for c in active)
    k = Fraction(history.k)
    p: dict[str, Fraction] = {}
    for c in active:
        w = Fraction(c.weight, total_weight)
        u = Fraction(history.usage.get(c.project, 0.0))
        p[c.project] = max(Fraction(0), w + k * (w - u))
    total = sum(p.values(), Fraction(0))
    if total == 0:
        # Not reached while the U of a pool's projects add up to at most 1 (then the sum of P
        # is at least 1): kept so that a division never divides by zero.
        p = {c.project: Fraction(c.weight, total_weight) for c in active}
        total = Fraction(1)
    if weights is not None:
        weights.update(p)
    return {c.project: remaining * p[c.project] / total for c in active}
