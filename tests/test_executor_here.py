"""The facts an actuator hands the planner (`Actuator.here`) are kept between plans while
nothing they are made of changed: whatever changed, what it hands over is what a `Here` made
afresh from the same facts says."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from events import NodeRegistered
from events.model import Replica
from services.executor.actuator import Actuator
from services.executor.config import ExecutorConfig
from services.executor.executor import runtime_for
from services.executor.facts import Here
from services.executor.sampling import UsageTracker
from services.runtime.clock import WALL_CLOCK
from services.runtime.gpu_samples import GpuSample
from services.runtime.host import InProcessHost

JOBS = ("a", "b", "c")
OFFER = NodeRegistered(
    id="n0/registered", time=0.0, actor="executor/n0", node="n0", pool="p", gpus=4
)

#: (what, job, attempt, replica index, a number for the change)
Step = tuple[str, str, int, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["add", "set", "set_attempt", "forget", "sample", "drop_samples", "node", "plan"]
        ),
        st.sampled_from(JOBS),
        st.integers(1, 2),
        st.integers(0, 1),
        st.integers(0, 3),
    ),
    max_size=40,
)


def fresh(actuator: Actuator, offer: NodeRegistered | None) -> Here:
    """The facts as a `Here` made from nothing kept."""
    return Here(
        node=actuator.node,
        actor=actuator.config.actor,
        boot_id=actuator.config.boot_id,
        saves=actuator.runtime.saves,
        objects=actuator.objects is not None,
        attempts={k: actuator._with_usage(k, a) for k, a in actuator.attempts.items()},
        replicas=dict(actuator.replicas),
        reported=set(actuator.reported),
        published=set(actuator.published),
        shut=dict(actuator.shut),
        closing=actuator.closing,
        lost=actuator.lost,
        registrations=actuator.registrations,
        offer=offer,
    )


def same(kept: Here, made: Here) -> None:
    for name in Here.__slots__:
        if name != "order":
            assert getattr(kept, name) == getattr(made, name), name


def apply(actuator: Actuator, step: Step) -> None:
    what, job, attempt, index, n = step
    inventory, usage = actuator.inventory, actuator.usage
    key = (job, attempt, Replica("n0", (index,)))
    if what == "add" and key not in inventory.replicas:
        inventory.attempt((job, attempt), index, announce=bool(n % 2), scheduled=None)
        inventory.add(key, index, launched=bool(n % 2))
    elif what == "set":
        inventory.set(key, ended=True, exit_code=n)
    elif what == "set_attempt":
        inventory.set_attempt((job, attempt), checkpoints=n)
    elif what == "forget":
        inventory.forget(key)
    elif what == "sample":
        held = {k: (i,) for i, k in enumerate(sorted(inventory.attempts)) if i < 4}
        usage.observe(0.0, tuple(GpuSample(index=i, utilization=10.0 * n) for i in range(4)), held)
    elif what == "drop_samples":
        usage.forget(set(list(inventory.attempts)[:n]))
    elif what == "node":  # one of the node's own facts
        if n == 0:
            actuator.closing = "stop" if actuator.closing == "" else "shutdown"
        elif n == 1:
            actuator.lost = not actuator.lost
        elif n == 2:
            actuator.registrations += 1
        else:  # made anew (a shut down reported), not changed in place
            actuator.shut = {(job, attempt): float(index)}
    elif what == "plan":
        actuator.reported.add(f"{job}/{attempt}/{n}")  # the sets are the actuator's own


@settings(max_examples=150, deadline=None)
@given(steps=steps, offered=st.booleans())
def test_what_the_planner_gets_is_always_what_the_facts_say(
    tmp_path_factory: object, steps: list[Step], offered: bool
) -> None:
    async def run() -> None:
        data = Path(str(tmp_path_factory.mktemp("here")))  # type: ignore[attr-defined]
        config = ExecutorConfig(node="n0", pool="p", gpus=4, hollow=True, data_dir=data)
        actuator = Actuator(
            InProcessHost(), config, runtime_for(config), WALL_CLOCK, UsageTracker(60.0)
        )
        offer = OFFER if offered else None
        same(actuator.here(offer), fresh(actuator, offer))
        for step in steps:
            apply(actuator, step)
            same(actuator.here(offer), fresh(actuator, offer))
            same(actuator.here(None), fresh(actuator, None))

    asyncio.run(run())


def test_a_plan_with_nothing_changed_gets_the_same_facts_again(tmp_path: Path) -> None:
    async def run() -> None:
        config = ExecutorConfig(node="n0", pool="p", gpus=4, hollow=True, data_dir=tmp_path)
        actuator = Actuator(
            InProcessHost(), config, runtime_for(config), WALL_CLOCK, UsageTracker(60.0)
        )
        apply(actuator, ("add", "a", 1, 0, 1))
        first = actuator.here()
        assert actuator.here() is first
        apply(actuator, ("set", "a", 1, 0, 0))
        assert actuator.here() is not first

    asyncio.run(run())
