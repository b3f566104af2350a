"""Every service survives an event it cannot handle: its follower sets the event aside on the
record (`EventSetAside` on `fl.aside.<service>`, which `fairlane status` lists) and goes on.

Admission, the ledger, the scheduler, the preemptor and the node watcher run on a real
nats-server, each on its own connection, as their processes run them. Two events that cannot
be read are written straight onto the log, one before they start (met while replaying) and one
while they follow the tail; afterwards a project is set, a job submitted, placed and relayed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from cluster.log_health import LogHealth, describe
from cluster.servers import NatsServer
from events import (
    EventSetAside,
    JobCancelled,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    WorkRelayed,
    encode_event,
    work_subject,
)
from events.commands import SetPool, SetProject
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.nodewatch.service import NodeWatch
from services.runtime.decider import Decider
from services.runtime.eventlog import JetStreamLog, Stored, connect
from services.runtime.follower import Follower
from services.runtime.memory_log import MemoryLog
from services.runtime.relays import relay_log
from services.runtime.tasks import cancel_and_wait
from tests.process_cluster import command, submit
from tests.protocols import Service

SERVICES = ("admission", "ledger", "scheduler", "preemptor", "nodewatch")
NODE = "n0"


def unreadable(job_id: str) -> bytes:
    """A `JobCancelled` of this version whose job id is a number: a known type, unreadable."""
    fields = msgspec.json.decode(
        encode_event(JobCancelled(id=f"{job_id}/bad", time=1.0, actor="u", job_id=job_id))
    )
    return msgspec.json.encode({**fields, "job_id": 7})


def places(e: object) -> bool:
    return isinstance(e, JobScheduled)


def preempts(e: object) -> bool:
    return type(e).__name__ in ("JobPreemptionRequested", "JobNominated")


async def set_aside(log: JetStreamLog) -> list[EventSetAside]:
    found = [s.event async for s in log.read(1, subject="fl.aside.>")]
    return [e for e in found if isinstance(e, EventSetAside)]


async def until(read: Callable[[], Any], what: str, within: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while not (seen := await read()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not reached")
        await asyncio.sleep(0.05)
    return seen


@pytest.fixture
async def log(nats_server: NatsServer) -> AsyncIterator[JetStreamLog]:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    yield log
    await log.nc.close()


async def test_each_service_sets_aside_what_it_cannot_read_and_goes_on(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    registered = NodeRegistered(
        id=f"{NODE}/registered", time=1.0, actor=NODE, node=NODE, pool="default", gpus=4
    )
    await log.publish(registered)
    replayed = await log.publish_raw("fl.job.old.job_cancelled", unreadable("old"))
    logs = {name: JetStreamLog(await connect(nats_server.url, name)) for name in SERVICES}
    services: dict[str, Service] = {
        "admission": Admission(logs["admission"]),
        "ledger": Ledger(logs["ledger"]),
        "scheduler": Decider(logs["scheduler"], "scheduler", places),
        "preemptor": Decider(logs["preemptor"], "preemptor", preempts),
        "nodewatch": NodeWatch(logs["nodewatch"], timeout_s=3600),
    }
    tasks = {name: asyncio.create_task(s.run()) for name, s in services.items()}
    try:
        assert (await command(log, SetPool(pool="default"))).ok  # serving: replay is over
        followed = await log.publish_raw("fl.job.new.job_cancelled", unreadable("new"))
        assert (await command(log, SetProject(project="a", pool="default", quota=4))).ok
        reply = await submit(log, "j1", JobSpec(project="a", gpus=2))
        assert reply.ok, reply.error

        async def relayed() -> list[Stored]:
            work = [s async for s in relay_log(log).read(1, subject=work_subject(NODE))]
            return [s for s in work if isinstance(s.event, WorkRelayed)]

        placement = (await until(relayed, "the placement relayed"))[0].event.event
        assert isinstance(placement, JobScheduled) and placement.job_id == "j1"

        def recorded(asides: list[EventSetAside]) -> bool:
            return {(a.service, a.seq) for a in asides} >= {
                (name, seq) for name in SERVICES for seq in (replayed, followed)
            }

        asides = await until(lambda: _matching(log, recorded), "every service's set-aside")
        assert all("cannot be read" in a.reason for a in asides), asides
        assert {a.subject for a in asides} == {
            "fl.job.old.job_cancelled",
            "fl.job.new.job_cancelled",
        }
        assert len(asides) == 2 * len(SERVICES)  # each recorded once
        last = await log.last_seq()
        preemptor = services["preemptor"]
        assert isinstance(preemptor, Decider)
        await preemptor.follower.wait_for(last)
        assert not any(t.done() for t in tasks.values())  # none stopped
        _, warnings = describe(LogHealth(log_seq=last, projected_seq=None, set_aside=tuple(asides)))
        assert f"scheduler set aside event {followed} (fl.job.new.job_cancelled)" in "\n".join(
            warnings
        )
    finally:
        for task in tasks.values():
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        for each in logs.values():
            await each.nc.close()


async def _matching(
    log: JetStreamLog, holds: Callable[[list[EventSetAside]], bool]
) -> list[EventSetAside]:
    asides = await set_aside(log)
    return asides if holds(asides) else []


async def test_an_event_whose_handling_raises_is_set_aside_once_across_a_restart() -> None:
    """The fold or the service's own handling raising is set aside too; a restarted service
    finds its record further on and does not write it again. A follower of no service (a
    tool) still stops there."""
    log = MemoryLog()
    for i in (1, 2, 3):
        spec = JobSpec(project="a", gpus=1)
        await log.publish(JobSubmitted(id=f"j{i}/s", time=float(i), actor="u", job_id=f"j{i}",
                                       spec=spec))  # fmt: skip

    async def refuse_j2(stored: Stored) -> None:
        if getattr(stored.event, "job_id", None) == "j2":
            raise ValueError("j2 is not for me")

    first = Follower(log, service="ledger")
    assert await first.catch_up(refuse_j2) == 3  # j2 folded; its handling raised
    assert first.applied_seq == 3 and "j3" in first.state.jobs
    asides = [s.event async for s in log.read(1, subject="fl.aside.ledger")]
    assert [(a.seq, a.reason) for a in asides if isinstance(a, EventSetAside)] == [
        (2, "ValueError: j2 is not for me")
    ]
    again = Follower(log, service="ledger")
    await again.catch_up(refuse_j2)
    assert again.set_aside == 1 and await log.last_seq() == 4
    with pytest.raises(ValueError, match="j2 is not for me"):
        await Follower(log).catch_up(refuse_j2)
