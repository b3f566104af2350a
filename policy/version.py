"""The policy's version: which rules made a decision.

Raise it whenever `policy.cycle.decide` would decide differently on the same state (the golden
decisions in tests/golden change). Decisions are stamped with it when they are published, so an
audit can tell a decision made by other rules from one that breaks these.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled

#: Host ports as part of fitting (`JobSpec.ports`) did not raise it: no state an earlier
#: version decided on had ports (the field is new), and on a state without them every decision
#: is the same (tests/golden unchanged).
POLICY_VERSION: Final = "2"


E = TypeVar("E", bound=Event)
DECISION_TYPES: Final = (JobScheduled, JobNominated, JobPreemptionRequested)


def stamped(event: E) -> E:
    """The decision with this policy's version on it (other events as they are)."""
    if isinstance(event, DECISION_TYPES) and not event.policy_version:
        return msgspec.structs.replace(event, policy_version=POLICY_VERSION)
    return event
