"""`python -m services.scheduler --nats URL`: the placement leader (standby if one leads)."""

from __future__ import annotations

from events import Event, JobScheduled
from services.runtime.decider import Decider
from services.runtime.main import run_service


def places(event: Event) -> bool:
    return isinstance(event, JobScheduled)


if __name__ == "__main__":
    run_service("scheduler", lambda log: Decider(log, "scheduler", places).run())
