"""When a node counts as lost: the pure rule, no clock or I/O of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def lapsed(
    registered: Iterable[str], last_seen: Mapping[str, float], now: float, timeout_s: float
) -> list[str]:
    """The registered nodes not seen alive for longer than `timeout_s`. `last_seen` is when
    the watcher last saw each node's heartbeat change (or the node register, or itself take
    the lead), on the watcher's own clock, so clocks of other machines play no part."""
    return sorted(n for n in registered if now - last_seen.get(n, float("-inf")) > timeout_s)
