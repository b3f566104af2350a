"""A command is refused only on a view of the whole log: a reader that lags (its server was
restarted a moment ago) must not answer "unknown job" for a job the log holds. Seen in the
compose test: a delete right after a NATS server was killed got 404 for a running job."""

from __future__ import annotations

import asyncio

import pytest

from events import JobSpec, NodeRegistered, PoolConfigured, ProjectConfigured, ProjectTerms
from events.commands import CancelJob, SubmitJob
from policy.commands import Accepted, decide_command
from services.runtime.commands import CommandRefused, carry_out
from services.runtime.follower import Follower
from services.runtime.memory_log import MemoryLog


async def a_log_with_one_job() -> MemoryLog:
    log = MemoryLog()
    await log.ensure_stream()
    setup = [
        PoolConfigured(id="p", time=0.0, actor="t", pool="gpu"),
        NodeRegistered(id="n", time=0.0, actor="t", node="n0", pool="gpu", gpus=4),
        ProjectConfigured(
            id="a", time=0.0, actor="t", project="a", terms={"gpu": ProjectTerms(quota=2)}
        ),
    ]
    for event in setup:
        await log.publish(event)
    writer = Follower(log)
    await writer.catch_up()
    outcome = decide_command(
        writer.state, SubmitJob(job_id="j1", spec=JobSpec(project="a")), 1.0, writer.applied_seq
    )
    assert isinstance(outcome, Accepted)
    for event in outcome.events:
        await log.publish(event)
    return log


async def test_a_lagging_reader_catches_up_before_it_refuses() -> None:
    log = await a_log_with_one_job()
    behind = Follower(log)  # knows nothing yet: its reader starts a moment later

    async def read_late() -> None:
        await asyncio.sleep(0.05)
        await behind.run()

    reader = asyncio.create_task(read_late())
    try:
        reply = await carry_out(log, behind, CancelJob(actor="u", job_id="j1"), 3.0)
        assert reply.ok and behind.state.jobs["j1"].phase == "cancelled"
        # a refusal still stands when the whole log says so
        with pytest.raises(CommandRefused, match="unknown job id 'ghost'"):
            await carry_out(log, behind, CancelJob(actor="u", job_id="ghost"), 3.0)
    finally:
        reader.cancel()
