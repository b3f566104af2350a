"""The policy without its bounds: for tests that check the bounds decide nothing themselves.

`fair_share._could_end_within_fair_share` and `reclaim_order.could_fit` spare the policy
walks through victims that cannot end in a preemption, and `fair_share._hopeful` lets an
in-project walk pass over victims that could never make room; with them off, every walk is
made, victim by victim.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from policy.schedulers import fair_share, reclaim


@contextmanager
def walking_every_victim() -> Iterator[None]:
    """The policy without the bounds that spare it walks through victims which cannot end in a
    preemption: it must decide the same."""
    with (
        patch.object(fair_share, "_could_end_within_fair_share", lambda *_: True),
        patch.object(reclaim, "could_fit", lambda *_: True),
        patch.object(fair_share, "_hopeful", lambda *_: None),
    ):
        yield
