"""The admission service: checks commands against the folded state and publishes the result.

A submission is recorded as `JobSubmitted` (its id derives from the job id, so a retry is one
job) and answered with `JobAdmitted` or `JobRejected` from `policy.admission.admit`, the same
pure function the scenario runner and the simulator use.

It starts from the newest snapshot of the fold (see services/runtime/snapshots.py) and replays
the rest. The idempotency keys and verdicts it answers a repeated submission with are kept for
the jobs it has seen in the log it read; for a job it knows only from the snapshot, they are
read back from the stream (the last message on the job's `job_submitted`, `job_admitted` and
`job_rejected` subjects): repeats are rare, so the lookup costs nothing in the common case.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from nats.js.errors import NotFoundError

from events import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobPaused,
    JobRejected,
    JobResumed,
    JobSubmitted,
    decode_event,
)
from events.commands import (
    ADMISSION_SUBJECT,
    AnyCommand,
    CancelJob,
    PauseJob,
    Reply,
    ResumeJob,
    SubmitJob,
)
from policy.admission import JOB_ID, admit
from policy.state import FINAL_PHASES, Job
from services.runtime.commands import Refusal, serve
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.snapshots import SnapshotStore

CONCURRENCY = 64


class Admission:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.follower = Follower(log, snapshots=SnapshotStore(log.js))
        self.keys: dict[str, str | None] = {}  # job id -> idempotency key of its submission
        self.verdicts: dict[str, JobAdmitted | JobRejected] = {}
        #: Submissions being recorded now: a second one for the same id waits for the first.
        self.inflight: dict[str, asyncio.Future[Reply]] = {}

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up(self._remember)
        # Submissions of different jobs do not depend on each other (admission reads only the
        # cluster's configuration), so they are handled side by side; one id at a time.
        await serve(self.log.nc, ADMISSION_SUBJECT, self.handle, concurrency=CONCURRENCY)
        await self.follower.run(self._remember)

    async def _remember(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, JobSubmitted):
            self.keys.setdefault(event.job_id, event.idempotency_key)
        elif isinstance(event, JobAdmitted | JobRejected):
            self.verdicts.setdefault(event.job_id, event)

    async def handle(self, command: AnyCommand) -> Reply:
        now, actor = time.time(), command.actor
        match command:
            case SubmitJob():
                return await self._submit(command, now)
            case CancelJob(job_id=job_id):
                job = self._job(job_id)
                if job.phase in FINAL_PHASES:
                    raise Refusal(f"job {job_id!r} is already {job.phase}")
                return await self._record(
                    JobCancelled(id=f"{job_id}/cancelled", time=now, actor=actor, job_id=job_id)
                )
            case PauseJob(job_id=job_id):
                job = self._job(job_id)
                if job.phase in FINAL_PHASES or job.phase in ("paused", "submitted"):
                    raise Refusal(f"job {job_id!r} cannot be paused: it is {job.phase}")
                event_id = f"{job_id}/paused/{self.follower.applied_seq}"
                return await self._record(
                    JobPaused(id=event_id, time=now, actor=actor, job_id=job_id)
                )
            case ResumeJob(job_id=job_id):
                job = self._job(job_id)
                if job.phase != "paused":
                    raise Refusal(f"job {job_id!r} is not paused: it is {job.phase}")
                event_id = f"{job_id}/resumed/{self.follower.applied_seq}"
                return await self._record(
                    JobResumed(id=event_id, time=now, actor=actor, job_id=job_id)
                )
        raise Refusal(f"admission does not take {type(command).__name__} commands")

    async def _submit(self, command: SubmitJob, now: float) -> Reply:
        job_id = command.job_id
        if not JOB_ID.match(job_id):
            raise Refusal(
                f"job id {job_id!r} is not valid: use 1-128 letters, digits, '-' or '_', "
                "starting with a letter or digit"
            )
        while job_id in self.inflight:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.inflight[job_id])
        if job_id in self.follower.state.jobs or job_id in self.keys:
            key = command.idempotency_key
            if key is not None:
                recorded_key, verdict = await self._recorded(job_id)
                if recorded_key == key and verdict is not None:
                    if isinstance(verdict, JobRejected):
                        return Reply(ok=False, event=verdict, error=verdict.reason)
                    return Reply(ok=True, event=verdict)
            raise Refusal(f"job id {job_id!r} already exists")
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.inflight[job_id] = done
        try:
            reply = await self._record_submission(command, now)
            done.set_result(reply)
            return reply
        except BaseException as e:
            done.set_exception(e)
            done.exception()  # retrieved here, so an unawaited failure is not reported twice
            raise
        finally:
            del self.inflight[job_id]

    async def _record_submission(self, command: SubmitJob, now: float) -> Reply:
        job_id = command.job_id
        submitted = JobSubmitted(
            id=f"{job_id}/submitted",
            time=now,
            actor=command.actor,
            job_id=job_id,
            spec=command.spec,
            idempotency_key=command.idempotency_key,
        )
        await self.log.publish_durably(submitted, give_up_after=5.0)
        verdict = admit(self.follower.state, submitted, now)
        await self.log.publish_durably(verdict, give_up_after=5.0)
        self.keys[job_id] = command.idempotency_key
        self.verdicts[job_id] = verdict
        if isinstance(verdict, JobRejected):
            return Reply(ok=False, event=verdict, error=verdict.reason)
        return Reply(ok=True, event=verdict)

    async def _recorded(self, job_id: str) -> tuple[str | None, JobAdmitted | JobRejected | None]:
        """The idempotency key a job was submitted with and the verdict it got."""
        if job_id in self.keys:
            return self.keys[job_id], self.verdicts.get(job_id)
        submitted = await self._last_on(f"fl.job.{job_id}.job_submitted")
        if not isinstance(submitted, JobSubmitted):
            return None, None
        verdict = await self._last_on(f"fl.job.{job_id}.job_admitted")
        if verdict is None:
            verdict = await self._last_on(f"fl.job.{job_id}.job_rejected")
        if not isinstance(verdict, JobAdmitted | JobRejected):
            return submitted.idempotency_key, None
        return submitted.idempotency_key, verdict

    async def _last_on(self, subject: str) -> Event | None:
        try:
            msg = await self.log.js.get_last_msg(self.log.stream, subject)
        except NotFoundError:
            return None
        try:
            return decode_event(msg.data or b"")
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def _job(self, job_id: str) -> Job:
        job = self.follower.state.jobs.get(job_id)
        if job is None:
            raise Refusal(f"unknown job id {job_id!r}")
        return job

    async def _record(self, event: Event) -> Reply:
        seq = await self.log.publish_durably(event, give_up_after=5.0)
        await self.follower.wait_for(seq)
        return Reply(ok=True, event=event)  # type: ignore[arg-type]
