"""The admission service: answers job commands from the folded state and records the result.

What a command leads to is decided by `policy.commands` (the same pure deciders the virtual
cluster and the scenario engines use); this service adds the log around them.

A submission is created once: its `JobSubmitted` is stored only if nothing is stored on the
job's subjects yet, and its verdict only if the submission is still the last thing there
(`Nats-Expected-Last-Subject-Sequence` over `fl.job.<id>.*`). Two admissions racing on one id,
or a retry after the stream's duplicate window, cannot make a job twice. If admission stops
between the two writes, the job is left `submitted`: it is admitted when admission starts
again, or when the submission is retried with its idempotency key.

It starts from the newest snapshot of the fold (see services/runtime/snapshots.py) and replays
the rest. The idempotency keys and verdicts it answers a repeated submission with are kept for
the jobs it has seen in the log it read; for a job it knows only from the snapshot, they are
read back from the stream (the last message on the job's `job_submitted`, `job_admitted` and
`job_rejected` subjects): repeats are rare, so the lookup costs nothing in the common case.
"""

from __future__ import annotations

import asyncio
import contextlib

from events import Event, JobAdmitted, JobRejected, JobSubmitted
from events.commands import ADMISSION_SUBJECT, LEDGER_COMMANDS, AnyCommand, Reply, SubmitJob
from policy.commands import Accepted, Refused, decide_command
from policy.commands.jobs import admit_waiting
from policy.commands.outcome import refuse
from services.runtime.clock import WALL_CLOCK, Clock
from services.runtime.commands import (
    GIVE_UP_AFTER_S,
    CommandRefused,
    MayTakeEffect,
    carry_out,
    outcome_unknown,
    time_left,
)
from services.runtime.eventlog import Conflict, EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.host import Host, nats_host
from services.runtime.retry import is_transient

SERVICE = "admission"
CONCURRENCY = 64

#: Admission's answer to a submission, as recorded
AdmissionEvent = JobAdmitted | JobRejected


def job_subjects(job_id: str) -> str:
    """Every subject of one job's events: the expectation that makes a job once."""
    return f"fl.job.{job_id}.>"


class Admission:
    def __init__(self, log: EventLog, clock: Clock = WALL_CLOCK, host: Host | None = None) -> None:
        self.log = log
        self.clock = clock
        self.host = host or nats_host(log)
        self.follower = Follower(log, snapshots=self.host.snapshots(), service=SERVICE)
        self.keys: dict[str, str | None] = {}  # job id -> idempotency key of its submission
        self.verdicts: dict[str, AdmissionEvent] = {}
        #: Submissions being recorded now: a second one for the same id waits for the first.
        self.inflight: dict[str, asyncio.Future[Reply]] = {}

    async def run(self) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up(self._remember)
        await self.admit_stranded()
        # Submissions of different jobs do not depend on each other (admission reads only the
        # cluster's configuration), so they are handled side by side; one id at a time.
        await self.host.serve(ADMISSION_SUBJECT, self.handle, concurrency=CONCURRENCY)
        await self.follower.run(self._remember)

    async def admit_stranded(self) -> int:
        """Give a verdict to every job recorded as submitted without one; returns how many."""
        stranded = [j.id for j in self.follower.state.jobs.values() if j.phase == "submitted"]
        for job_id in stranded:
            await self._verdict_for_stranded(job_id)
        return len(stranded)

    async def _remember(self, stored: Stored) -> None:
        event = stored.event
        # the latest: a rejected job's name may be submitted again, with a key of its own
        if isinstance(event, JobSubmitted):
            self.keys[event.job_id] = event.idempotency_key
            self.verdicts.pop(event.job_id, None)
        elif isinstance(event, JobAdmitted | JobRejected):
            self.verdicts[event.job_id] = event

    async def handle(self, command: AnyCommand) -> Reply:
        if isinstance(command, LEDGER_COMMANDS):
            kind = type(command).__name__
            raise CommandRefused(refuse("not_taken_here", None, kind, service="admission"))
        if isinstance(command, SubmitJob):
            return await self._submit(command)
        now = self.clock.now()
        return await carry_out(self.log, self.follower, command, now)

    async def _submit(self, command: SubmitJob) -> Reply:
        job_id = command.job_id
        while job_id in self.inflight:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.inflight[job_id])
        if await self._name_taken(command):
            return await self._repeated(command)
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.inflight[job_id] = done
        try:
            reply = await self._create(command)
            done.set_result(reply)
            return reply
        except BaseException as e:
            done.set_exception(e)
            done.exception()  # retrieved here, so an unawaited failure is not reported twice
            raise
        finally:
            del self.inflight[job_id]

    async def _create(self, command: SubmitJob) -> Reply:
        now = self.clock.now()
        outcome = decide_command(self.follower.state, command, now, self.follower.applied_seq)
        if _said_no(outcome):  # stands only on the whole log (the project was set just now?)
            await self.follower.wait_for(await self.log.last_seq(), within=GIVE_UP_AFTER_S)
            outcome = decide_command(self.follower.state, command, now, self.follower.applied_seq)
        if isinstance(outcome, Refused):
            if outcome.exists:
                return await self._repeated(command)
            raise CommandRefused(outcome)
        submitted, verdict = outcome.events
        assert isinstance(submitted, JobSubmitted) and isinstance(verdict, AdmissionEvent)
        subjects = job_subjects(command.job_id)
        known = self.follower.state.jobs.get(command.job_id)
        # create-once: nothing on the job's subjects yet, or nothing after its rejection
        last = known.rejected_at if known is not None else 0
        try:
            seq = await self.log.publish_durably(
                submitted, fence=(subjects, last), give_up_after=time_left()
            )
        except Conflict:  # made meanwhile by another admission, or long before this state
            await self.follower.wait_for(await self.log.last_seq())
            return await self._repeated(command)
        except Exception as e:  # no answer from the log: the submission may land yet
            if outcome_unknown(e):
                raise MayTakeEffect(command, e) from e
            raise
        self.keys[command.job_id] = command.idempotency_key
        self.verdicts.pop(command.job_id, None)
        try:
            standing = await self._record_verdict(verdict, subjects, seq)
        except Exception as e:  # the job is recorded: a retry with its key gets the verdict
            if is_transient(e):
                raise MayTakeEffect(command, e) from e
            raise
        if standing is None:
            raise CommandRefused(refuse("ended", "job_id", command.job_id))
        return _reply(standing)

    async def _record_verdict(
        self, verdict: AdmissionEvent, subjects: str, submitted_seq: int
    ) -> AdmissionEvent | None:
        """Store the verdict unless the job has one already; returns the one that stands
        (None: the job was ended, by a cancel, before it got one)."""
        try:
            await self.log.publish_durably(
                verdict, fence=(subjects, submitted_seq), give_up_after=time_left()
            )
        except Conflict:
            return await self._recorded_verdict(verdict.job_id)
        self.verdicts[verdict.job_id] = verdict
        return verdict

    async def _name_taken(self, command: SubmitJob) -> bool:
        """Whether the id is a job's already: any job but a rejected one, and a rejected one
        too when this is a retry with the key it was submitted with (answered with that
        verdict). The key is read from the log when the submission is older than what this
        instance folded itself (restored from a snapshot)."""
        job = self.follower.state.jobs.get(command.job_id)
        if job is None:
            return command.job_id in self.keys
        if job.phase != "rejected":
            return True
        key = command.idempotency_key
        return key is not None and key == await self._recorded_key(command.job_id)

    async def _repeated(self, command: SubmitJob) -> Reply:
        """A submission for an id that exists: with the same idempotency key, the first
        verdict (given now if the job never got one); otherwise a refusal."""
        job_id, key = command.job_id, command.idempotency_key
        if key is None or await self._recorded_key(job_id) != key:
            raise CommandRefused(refuse("name_taken", "job_id", job_id))
        verdict = await self._recorded_verdict(job_id) or await self._verdict_for_stranded(job_id)
        if verdict is None:
            raise CommandRefused(refuse("name_taken", "job_id", job_id))
        return _reply(verdict)

    async def _verdict_for_stranded(self, job_id: str) -> AdmissionEvent | None:
        submitted = await self.log.last_on(f"fl.job.{job_id}.job_submitted")
        if submitted is None:
            return None
        # recorded, but the fold may not have come to it yet (it catches up after the server
        # came back): a retry must not be refused as a name taken for want of waiting
        await self.follower.wait_for(submitted.seq)
        job = self.follower.state.jobs.get(job_id)
        if job is None:
            return None
        decided = admit_waiting(self.follower.state, job, self.clock.now())
        if decided is None:
            return await self._recorded_verdict(job_id)
        verdict = decided.answer
        assert isinstance(verdict, AdmissionEvent)
        return await self._record_verdict(verdict, job_subjects(job_id), submitted.seq)

    async def _recorded_key(self, job_id: str) -> str | None:
        if job_id in self.keys:
            return self.keys[job_id]
        submitted = await self._last_event(f"fl.job.{job_id}.job_submitted")
        return submitted.idempotency_key if isinstance(submitted, JobSubmitted) else None

    async def _recorded_verdict(self, job_id: str) -> AdmissionEvent | None:
        if job_id in self.verdicts:
            return self.verdicts[job_id]
        for kind in ("job_admitted", "job_rejected"):
            verdict = await self._last_event(f"fl.job.{job_id}.{kind}")
            if isinstance(verdict, JobAdmitted | JobRejected):
                return verdict
        return None

    async def _last_event(self, subject: str) -> Event | None:
        stored = await self.log.last_on(subject)
        return None if stored is None else stored.event


def _reply(event: Event) -> Reply:
    if isinstance(event, JobRejected):
        return Reply(ok=False, event=event, error=event.reason, code=event.code, field=event.field)
    return Reply(ok=True, event=event)  # type: ignore[arg-type]


def _said_no(outcome: Accepted | Refused) -> bool:
    """A refusal, or a submission recorded with its rejection."""
    return isinstance(outcome, Refused) or isinstance(outcome.events[-1], JobRejected)
