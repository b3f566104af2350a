"""What a command decider answers: the events to record, or a refusal with its code."""

from __future__ import annotations

from dataclasses import dataclass

from events.catalogue import AnyEvent
from events.refusals import RefusalCode, say


@dataclass(frozen=True, slots=True)
class Accepted:
    """Record these events, in this order; the last one is the command's answer."""

    events: tuple[AnyEvent, ...]

    @property
    def answer(self) -> AnyEvent:
        return self.events[-1]


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing is recorded: why (`code`), the request field it is about, and the words, which
    name the bad value."""

    code: RefusalCode
    field: str | None
    reason: str

    @property
    def exists(self) -> bool:
        """The job already exists: a retried submission may be answered with its first verdict."""
        return self.code == "name_taken"


def refuse(code: RefusalCode, field: str | None, value: object = None, **values: object) -> Refused:
    """A refusal with its words from `events.refusals.WORDS`."""
    return Refused(code, field, say(code, value, **values))


Outcome = Accepted | Refused
