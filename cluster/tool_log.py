"""How a cluster tool (the command line's cluster verbs, the supervisor) logs: as the services
do, JSON lines on stderr, so that one reader reads the services' logs and the tools' alike."""

from __future__ import annotations

from services.runtime.main import configure_logging


def log_like_services(level: str = "info") -> None:
    configure_logging(level)
