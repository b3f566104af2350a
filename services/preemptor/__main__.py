"""`python -m services.preemptor --nats URL`: the preemption leader (standby if one leads)."""

from __future__ import annotations

from events import Event, JobNominated, JobPreemptionRequested
from services.runtime.decider import Decider
from services.runtime.main import run_service


def preempts(event: Event) -> bool:
    return isinstance(event, JobPreemptionRequested | JobNominated)


if __name__ == "__main__":
    run_service("preemptor", lambda log: Decider(log, "preemptor", preempts).run())
