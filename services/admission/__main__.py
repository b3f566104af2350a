"""`python -m services.admission --nats URL`."""

from __future__ import annotations

from services.admission.service import Admission
from services.runtime.main import run_service

if __name__ == "__main__":
    run_service("admission", lambda log: Admission(log).run())
