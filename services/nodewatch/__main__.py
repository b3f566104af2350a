"""`python -m services.nodewatch --nats URL`: the node watcher (standby if one leads)."""

from __future__ import annotations

from services.nodewatch.service import NodeWatch
from services.runtime.main import run_service

if __name__ == "__main__":
    run_service("nodewatch", lambda log: NodeWatch(log).run())
