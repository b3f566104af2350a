"""Starting the replicas here: the launch (its environment, the endpoint's socket and token),
the checkpoint fetched first, the ports it needs checked, then the runtime's start; and running
one (started or adopted) until it ends, with its output shipped."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path
from typing import Final

from services.executor.checkpointing import Checkpointing
from services.executor.facts import ReplicaKey
from services.executor.gang import port_taken
from services.executor.inventory import Handle, Inventory, attempt_of
from services.executor.launch import Site, launch_of
from services.executor.local import marker_mtime
from services.executor.plan import Start
from services.executor.runtime import SIGTERM_EXIT, TOKEN_ENV, Launch
from services.executor.watching import Watching

CANNOT_START: Final = 126  # the exit code reported for a replica that could not be started


class Starting:
    def __init__(
        self, inventory: Inventory, checkpointing: Checkpointing, watching: Watching
    ) -> None:
        self.inventory, self.checkpointing, self.watching = inventory, checkpointing, watching
        self.site = Site(inventory.node, inventory.checkpoints, inventory.data_dir)
        self.endpoint_path: Path | None = None  # set by the executor's endpoint
        self.logger = inventory.logger

    def start(self, action: Start) -> None:
        job = action.job
        key = (job.job_id, job.attempt, action.replica)
        self.inventory.attempt(attempt_of(key), action.index, action.announce, action.scheduled_id)
        handle = self.inventory.add(key, action.index)
        launch = launch_of(job, action.index, action.replica, self.site)
        if self.endpoint_path is not None:
            launch.env["FAIRLANE_EVENTS"] = str(self.endpoint_path)
            launch.env[TOKEN_ENV] = handle.token = secrets.token_urlsafe(24)
        self.logger.info("starting", job=job.job_id, attempt=job.attempt, replica=action.index)
        self.inventory.spawn(self.run(key, handle, launch))

    async def run(self, key: ReplicaKey, handle: Handle, launch: Launch | None) -> None:
        """Start (or, with no `launch`, watch an adopted) replica until it ends."""
        if self.inventory.runtime.real:
            self.inventory.spawn(self.watching.ship(handle))
        if launch is not None and not await self._launch(key, handle, launch):
            return
        await self.watching.watch(key, handle)

    async def _launch(self, key: ReplicaKey, handle: Handle, launch: Launch) -> bool:
        """Fetch its checkpoint, check its ports, start it; False: not started."""
        inventory = self.inventory
        await self.checkpointing.fetch(key, handle)
        handle.stored_mark = marker_mtime(launch.checkpoint_dir)  # older saves are not its own
        facts = inventory.replicas.get(key)
        if facts is None or facts.stop_at is not None:  # asked to stop before it started
            self.watching.ended(key, handle, SIGTERM_EXIT, "")
            return False
        if (why := self._port_taken(launch)) is not None:
            self.logger.error("a port is taken", job=key[0], why=why)
            self.watching.ended(key, handle, CANNOT_START, why)
            return False
        attempt = inventory.attempts.get(attempt_of(key))
        try:
            baseline = attempt.baseline if attempt is not None else None
            handle.workload = await inventory.runtime.start(launch, inventory.node, baseline)
        except Exception:  # the node cannot start it (a full disk, ...): the attempt fails
            self.logger.exception("could not start", job=key[0], replica=handle.index)
            self.watching.ended(key, handle, CANNOT_START, "")
            return False
        inventory.save_records()
        facts = inventory.replicas.get(key)
        if facts is not None and facts.stop_at is not None:  # asked to stop while starting
            handle.workload.signal(signal.SIGTERM)
        return True

    def _port_taken(self, launch: Launch) -> str | None:
        """Why the replica cannot start here, where something outside Fairlane already
        listens on a port it needs (the policy never gives one node's port to two replicas):
        the attempt's rendezvous port, where replica 0 is to start here, instead of its
        replicas waiting for a master that cannot bind; or a host port it publishes
        (`--port`), instead of a workload that fails to serve. The attempt fails at once."""
        if not self.inventory.runtime.real:
            return None
        node = self.inventory.node
        port = launch.env.get("MASTER_PORT")
        if launch.replica == 0 and port is not None and port_taken(int(port)):
            return (
                f"the rendezvous port {port} (MASTER_PORT) on {node} is taken by another "
                "process: nothing was started; the next attempt gets another port"
            )
        for mapping in launch.ports:
            if port_taken(mapping.host):
                return (
                    f"host port {mapping.host} (--port {mapping.host}:{mapping.container}) on "
                    f"{node} is taken by a program outside Fairlane: nothing was started"
                )
        return None
