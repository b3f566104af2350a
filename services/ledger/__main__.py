"""`python -m services.ledger --nats URL`."""

from __future__ import annotations

from services.ledger.service import Ledger
from services.runtime.main import run_service

if __name__ == "__main__":
    run_service("ledger", lambda log: Ledger(log).run())
