"""The relay stream: each node's work, kept apart from the log.

The node watcher relays to each node the events that concern it (services/nodewatch/work.py)
on `fl-work.<node>`, in a stream of its own, `FAIRLANE_WORK` on `fl-work.>`, so that none of
the log's other readers (admission, the ledger, the deciders, the projector) ever receives
them: about three of a job's eight events are relays. Its subjects are outside the log's
`fl.>` because NATS refuses two streams whose subjects overlap.

A fence names a subject of the stream it is written to, so the watcher's leader records its
term in this stream too (`LeaderElected` on `fl-work.leader.<kind>`, besides the log's
`fl.leader.<kind>`) and fences every relay on it: a deposed watcher's relay is refused once a
newer term is recorded here.
"""

from __future__ import annotations

from typing import Final

from events import Event, LeaderElected, subject_for, work_subject
from services.runtime.eventlog import EventLog, JetStreamLog

RELAY_STREAM: Final = "FAIRLANE_WORK"
RELAY_SUBJECTS: Final = [work_subject(">")]


def term_subject(kind: str) -> str:
    """Where a leader that relays records its term in the relay stream (three tokens: never a
    node's, `fl-work.<node>`)."""
    return work_subject(f"leader.{kind}")


def relay_subject(event: Event) -> str:
    """Where an event is written in the relay stream: a relay on its node's subject, a term
    on its kind's."""
    if isinstance(event, LeaderElected):
        return term_subject(event.kind)
    return subject_for(event)


def relay_log(log: EventLog) -> JetStreamLog:
    """The relay stream beside `log`, on its connection, read through a durable consumer of
    the same name as the log's (in another stream, so another consumer)."""
    if not isinstance(log, JetStreamLog):
        raise TypeError(f"no relay stream beside {type(log).__name__}: give its host's")
    return JetStreamLog(
        log.nc,
        stream=RELAY_STREAM,
        durable=log.durable,
        subjects=RELAY_SUBJECTS,
        subject_of=relay_subject,
    )
