"""Watching and stopping the replicas here: their signals (SIGTERM, SIGKILL once the planner
says the grace is over), their output shipped while they run, and their ends made facts (an
exit code, and what is known of why)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from services.executor.checkpointing import Checkpointing
from services.executor.facts import ReplicaKey
from services.executor.inventory import Handle, Inventory, attempt_of
from services.executor.logs import attempt_log_path
from services.executor.logship import ship_replica
from services.runtime.host import Host

LAST_LINE_BYTES: Final = 4096


class Watching:
    def __init__(self, inventory: Inventory, host: Host, checkpointing: Checkpointing) -> None:
        self.inventory, self.host, self.checkpointing = inventory, host, checkpointing
        self.logger = inventory.logger

    def signal(self, key: ReplicaKey, sig: int, **changes: object) -> None:
        """Send a replica still running here `sig`, with what that changes in its facts."""
        self.inventory.set(key, **changes)
        handle, facts = self.inventory.handles.get(key), self.inventory.replicas.get(key)
        if handle is not None and handle.workload is not None and facts and not facts.ended:
            handle.workload.signal(sig)

    async def watch(self, key: ReplicaKey, handle: Handle) -> None:
        """A replica running (started or adopted) until it ends."""
        assert handle.workload is not None
        self.inventory.set(key, launched=True, has_workload=True)
        handle.launched.set()
        code = await handle.workload.wait()
        self.logger.info("workload ended", replica=key[:2], index=handle.index, exit_code=code)
        self.ended(key, handle, code, handle.workload.failure or "")

    def ended(self, key: ReplicaKey, handle: Handle, code: int | None, detail: str) -> None:
        """It ended (or never started): its exit code, and the workload's last line where it
        failed and nothing else says why."""
        if code not in (None, 0) and not detail:
            path = attempt_log_path(self.inventory.data_dir, key[0], key[1], handle.index)
            detail = last_line(path)
        self.inventory.set(key, launched=True, ended=True, exit_code=code, detail=detail)
        self.checkpointing.look(attempt_of(key))
        handle.launched.set()
        handle.finished.set()

    async def ship(self, handle: Handle) -> None:
        """Its output, to the log stream as it comes, until it ended and all is shipped."""
        await ship_replica(
            self.host.output(),
            attempt_log_path(self.inventory.data_dir, handle.job_id, handle.attempt, handle.index),
            (self.inventory.node, handle.job_id, handle.attempt, handle.index),
            handle.launched,
            handle.finished,
        )


def last_line(path: Path) -> str:
    """The last line of a log file (at most 200 characters), or ''."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - LAST_LINE_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
