"""Rule 11: each project's decayed usage of a pool, kept exactly by the fold.

A project's decayed usage at time t is the GPU-seconds it held, each second s weighted by
0.5 ** ((t - s) / half_life). Between two events the GPUs held are constant, so the integral
over that stretch has a closed form: with g GPUs held from t0 to t1 (dt = t1 - t0, h the
half-life),

    value(t1) = value(t0) * 2 ** (-dt / h) + g * h / ln 2 * (1 - 2 ** (-dt / h))

The fold keeps, per pool with a half-life, one `Decayed` (value, as_of, GPUs held now) per
project and one for the pool's own GPUs, moved on only when what it counts changes; a cycle
evaluates them at its `now` with the same formula. No sampling, no store outside the log, and
the cost of a cycle does not grow with the length of the history. U, a project's part of the
pool, is its value divided by the pool's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec

LN2: Final = math.log(2.0)
#: Bounds of the settings (rule 11): a half-life longer than 0 and at most ten years, and a
#: k from 0 (the history changes nothing) to 100.
MAX_HALF_LIFE_S: Final = 10 * 365 * 86_400.0
MAX_K: Final = 100.0
#: U is used, and recorded on decisions, to this many decimals: the facts a decision carries
#: are then exactly the numbers the division used.
U_DIGITS: Final = 6


def settings_problem(
    half_life_s: float | None, k: float, flags: Mapping[str, str] | None = None
) -> str | None:
    """What is wrong with a pool's rule 11 settings, naming the value, or None; led by the
    flag that gave it where `flags` names each setting's (`usage_half_life_s`, `usage_k`)."""
    found = settings_refusal(half_life_s, k)
    if found is None:
        return None
    setting, words = found
    return words if flags is None else f"{flags[setting]}: {words}"


def settings_refusal(half_life_s: float | None, k: float) -> tuple[str, str] | None:
    """The setting out of its bounds (`usage_half_life_s` or `usage_k`) and the words that
    say so, naming the value; None if both are within them."""
    # imported here: the CLI reads this module for its words (`in_words`), and the `events`
    # package would bring the whole event catalogue, a second on every command
    from events.refusals import say  # noqa: PLC0415

    if half_life_s is not None and not (
        math.isfinite(half_life_s) and 0 < half_life_s <= MAX_HALF_LIFE_S
    ):
        bound = f"be longer than 0 and at most 10 years ({MAX_HALF_LIFE_S:.0f}s)"
        words = say("out_of_range", f"{half_life_s!r}s", what="usage_half_life", bound=bound)
        return "usage_half_life_s", words
    if not (math.isfinite(k) and 0 <= k <= MAX_K):
        return "usage_k", say(
            "out_of_range", repr(k), what="usage_k", bound=f"be between 0 and {MAX_K:g}"
        )
    return None


class Decayed(msgspec.Struct, array_like=True):
    """Decayed GPU-seconds as of `as_of`, and the GPUs held since then."""

    value: float = 0.0
    as_of: float = 0.0
    gpus: int = 0

    def at(self, t: float, half_life_s: float) -> float:
        """The decayed GPU-seconds at time t (not before `as_of`: the clock never goes back)."""
        dt = t - self.as_of
        if dt <= 0:
            return self.value
        x = -dt * LN2 / half_life_s
        return self.value * math.exp(x) - self.gpus * half_life_s / LN2 * math.expm1(x)

    def move(self, t: float, half_life_s: float, gpus: int) -> None:
        """Carry the value on to t, from where `gpus` more (or fewer) are held."""
        if t > self.as_of:
            self.value, self.as_of = self.at(t, half_life_s), t
        self.gpus = max(0, self.gpus + gpus)


class PoolUsage(msgspec.Struct, array_like=True):
    """A pool's decayed GPU-seconds (its capacity) and each project's, under one half-life."""

    half_life_s: float
    capacity: Decayed
    projects: dict[str, Decayed] = msgspec.field(default_factory=dict)

    def held(self, project: str, t: float, gpus: int) -> None:
        found = self.projects.get(project)
        if found is None:
            found = self.projects[project] = Decayed(0.0, t, 0)
        found.move(t, self.half_life_s, gpus)

    def retune(self, t: float, half_life_s: float) -> None:
        """A new half-life from t on: every value decays with the old one up to t, with the
        new one after (so U does not jump when the setting changes)."""
        for acc in (self.capacity, *self.projects.values()):
            acc.move(t, self.half_life_s, 0)
        self.half_life_s = half_life_s

    def shares(self, t: float) -> dict[str, float]:
        """U per project at t: its decayed GPU-seconds over the pool's, rounded to U_DIGITS,
        0 while the pool has none. Clamped to [0, 1]: a project only holds GPUs of the pool,
        so only a node registered again with fewer GPUs than are held could exceed it."""
        total = self.capacity.at(t, self.half_life_s)
        if total <= 0:
            return {p: 0.0 for p in self.projects}
        return {
            p: round(min(1.0, max(0.0, acc.at(t, self.half_life_s) / total)), U_DIGITS)
            for p, acc in self.projects.items()
        }


def in_words(history: dict[str, Any]) -> str:
    """What the history did to the shares, for a person (the timeline's reason): one clause per
    project whose share it moved. `history` is a decision's `UsageFacts` as plain data."""
    shares, plain = history.get("fair_share", {}), history.get("without_history", {})
    usage = history.get("decayed_usage", {})
    half_life = _duration(float(history.get("half_life_s", 0.0)))
    said = [
        f"project {p} has used {round(100 * float(usage.get(p, 0.0)))}% of the pool over the "
        f"last hours (half-life {half_life}); its share is {share}, not {plain.get(p, share)}"
        for p, share in shares.items()
        if share != plain.get(p, share)
    ]
    return "; ".join(said)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
