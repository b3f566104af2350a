"""What a command decider answers: the events to record, or a refusal with its reason."""

from __future__ import annotations

from dataclasses import dataclass

from events.catalogue import AnyEvent


@dataclass(frozen=True, slots=True)
class Accepted:
    """Record these events, in this order; the last one is the command's answer."""

    events: tuple[AnyEvent, ...]

    @property
    def answer(self) -> AnyEvent:
        return self.events[-1]


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing is recorded; `reason` names the bad value."""

    reason: str
    #: The job already exists: a retried submission may be answered with its first verdict.
    exists: bool = False


Outcome = Accepted | Refused
