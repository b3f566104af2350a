"""The policy without its bounds: for tests that check the bounds decide nothing themselves.

`fair_share._could_end_within_fair_share` and `reclaim_order.could_fit` spare the policy
walks through victims that cannot end in a preemption, and `fair_share._hopeful` lets an
in-project walk pass over victims that could never make room; with them off, every walk is
made, victim by victim. (`cycle._not_placed`, which tells the candidates left by a pool from
those placed elsewhere reading few jobs, reads every one too.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from policy import cycle
from policy.candidates import Candidate
from policy.schedulers import fair_share, reclaim


def _not_placed(left: list[Candidate], placed: set[str], here: set[str]) -> list[Candidate]:
    return [c for c in left if c.job.id not in placed]


@contextmanager
def walking_every_victim() -> Iterator[None]:
    """The policy without the bounds that spare it walks through victims which cannot end in a
    preemption: it must decide the same."""
    with (
        patch.object(fair_share, "_could_end_within_fair_share", lambda *_: True),
        patch.object(reclaim, "could_fit", lambda *_: True),
        patch.object(fair_share, "_hopeful", lambda *_: None),
        patch.object(cycle, "_not_placed", _not_placed),
    ):
        yield
