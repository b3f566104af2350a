"""`python -m services.preemptor --nats URL`: the preemption leader (standby if one leads)."""

from __future__ import annotations

from events import Event, JobNominated, JobPreemptionRequested
from services.runtime.decider import Decider
from services.runtime.main import run_service

#: Preemptions wait out grace periods of seconds; 25 ms more to gather news costs nothing
#: there, and a preemptor that decides less often spends far less on cycles that find no victim.
SETTLE_S = 0.025


def preempts(event: Event) -> bool:
    return isinstance(event, JobPreemptionRequested | JobNominated)


if __name__ == "__main__":
    run_service(
        "preemptor", lambda log: Decider(log, "preemptor", preempts, settle_s=SETTLE_S).run()
    )
