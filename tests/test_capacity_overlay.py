"""`OverlayFit` answers as `Capacity.fits` does while its overlay changes a node at a time.

Looking for victims asks "does the candidate fit now?" after every victim; `OverlayFit` keeps
running totals instead of walking the overlay each time. Random pools, requests and sequences
of overlay changes (nodes of this pool and of none, growing and shrinking) must give the same
answer as `Capacity.fits` on the overlay as it stands.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policy.capacity import Capacity, NodeSlots, OverlayFit

NODES = [f"n{i}" for i in range(6)]
#: overlay changes may name a node the pool does not have (fits ignores its slots, not its GPUs)
NAMES = [*NODES, "elsewhere"]


@st.composite
def pools(draw: st.DrawFn) -> Capacity:
    slots = []
    for i, name in enumerate(NODES[: draw(st.integers(0, len(NODES)))]):
        gpus = draw(st.integers(0, 8))
        free = sorted(draw(st.sets(st.integers(0, gpus - 1), max_size=gpus))) if gpus else []
        slots.append(NodeSlots(name, i, i, gpus, free))
    return Capacity(slots)


@given(
    capacity=pools(),
    # GPUs per replica, replicas, the node it is pinned to
    request=st.tuples(st.integers(0, 9), st.integers(1, 4), st.none() | st.sampled_from(NAMES)),
    start=st.dictionaries(st.sampled_from(NAMES), st.integers(0, 8), max_size=4),
    changes=st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 8)), max_size=12),
)
def test_overlay_fit_agrees_with_capacity_fits(
    capacity: Capacity,
    request: tuple[int, int, str | None],
    start: dict[str, int],
    changes: list[tuple[str, int]],
) -> None:
    gpus, replicas, pin = request
    overlay = {node: list(range(100, 100 + size)) for node, size in start.items()}
    fit = OverlayFit(capacity, gpus, replicas, pin, overlay)
    assert fit.fits() == capacity.fits(gpus, replicas, pin, overlay=overlay)
    for node, size in changes:
        overlay[node] = list(range(100, 100 + size))
        fit.resize(node, size)
        assert fit.fits() == capacity.fits(gpus, replicas, pin, overlay=overlay), (node, size)
