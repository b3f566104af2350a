"""`python -m services.nodewatch --nats URL`: the node watcher (standby if one leads); its
heartbeat timeout from `FAIRLANE_HEARTBEAT_TIMEOUT_S` (see `timeout_from_env`)."""

from __future__ import annotations

from services.nodewatch.service import NodeWatch, timeout_from_env
from services.runtime.main import run_service

if __name__ == "__main__":
    timeout = timeout_from_env()
    run_service("nodewatch", lambda log: NodeWatch(log, timeout_s=timeout).run())
