"""The replicas' checkpoints on this node: seeing what they saved, storing it in the cluster's
checkpoint store (`storage.py`, through the host) and fetching it before a later attempt.

Each outcome is a fact in the inventory (a save not stored yet, a store done or refused over the
bound, a fetch that failed); the planner decides what to store and when, and what to say of it.
"""

from __future__ import annotations

from services.executor.facts import AttemptKey, OverBound, ReplicaKey
from services.executor.inventory import Handle, Inventory, attempt_of
from services.executor.local import marker_mtime
from services.executor.storage import ObjectCheckpoints, object_name


class Checkpointing:
    """`objects`: the cluster's checkpoint store (None: a shared folder, or replicas that save
    nothing: nothing is copied)."""

    def __init__(self, inventory: Inventory, objects: ObjectCheckpoints | None) -> None:
        self.inventory, self.objects = inventory, objects
        self.logger = inventory.logger

    def look(self, key: AttemptKey) -> None:
        """The attempt's marker as it is now."""
        folder = self.inventory.folders.get(key)
        if folder is not None and self.inventory.runtime.saves:
            self.inventory.set_attempt(key, mark=marker_mtime(folder))

    def look_all(self) -> None:
        """The poll: every attempt's marker, and which running replicas saved since stored."""
        inventory = self.inventory
        for key in list(inventory.attempts):
            self.look(key)
        for rkey, facts in list(inventory.replicas.items()):
            handle = inventory.handles.get(rkey)
            if handle is not None and not facts.ended and not facts.storing:
                if self.unsaved(handle) != facts.unsaved:
                    inventory.set(rkey, unsaved=not facts.unsaved)

    def unsaved(self, handle: Handle) -> bool:
        if self.objects is None:
            return False
        if handle.saves > handle.stored_saves:
            return True
        mark = marker_mtime(handle.folder)
        return mark is not None and (handle.stored_mark is None or mark > handle.stored_mark)

    def saved(self, handle: Handle) -> None:
        """The workload said it saved a checkpoint: stored at the next poll."""
        handle.saves += 1
        self.inventory.set_attempt((handle.job_id, handle.attempt), saved_by_workload=True)

    async def store(self, key: ReplicaKey, after_stop: bool) -> None:
        """Store the replica's folder if it saved since it was last stored; a folder over the
        bound is not stored (the planner puts that on the job's timeline)."""
        handle = self.inventory.handles.get(key)
        changes: dict[str, object] = {"storing": False, "unsaved": False}
        if after_stop:
            changes["stored_after_stop"] = True
        try:
            if handle is not None and self.objects is not None and self.unsaved(handle):
                changes.update(await self._put(self.objects, handle, after_stop))
        except Exception:
            self.logger.exception("checkpoint not stored", job=key[0], replica=key[1:])
        self.inventory.set(key, **changes)
        self.look(attempt_of(key))

    async def _put(
        self, objects: ObjectCheckpoints, handle: Handle, after_stop: bool
    ) -> dict[str, object]:
        mark, saves = marker_mtime(handle.folder), handle.saves
        stored = await objects.store(handle.folder, object_name(handle.job_id, handle.index))
        handle.stored_mark, handle.stored_saves = mark, saves
        if stored.over_bound:
            self.logger.warning("checkpoint over the bound: not stored", size=stored.size)
            over = OverBound(saves, mark, stored.size, objects.max_bytes)
            return {"over_bound": over, "size": stored.size, "refused": True}
        if stored.digest is None:
            return {}
        self.logger.info("checkpoint stored", object=stored.name, size=stored.size)
        stored_bytes = stored.size if after_stop else 0
        return {"size": stored.size, "refused": False, "stored_bytes": stored_bytes}

    async def fetch(self, key: ReplicaKey, handle: Handle) -> None:
        """Before a later attempt's replica starts here: its folder made the stored
        checkpoint, where this node's copy is not it; a failure starts it from what is here."""
        if self.objects is None or handle.attempt <= 1:
            return
        try:
            size = await self.objects.fetch(handle.folder, object_name(key[0], handle.index))
        except Exception as e:  # the store away, a digest that does not match
            self.logger.exception("checkpoint not fetched", job=key[0], replica=handle.index)
            self.inventory.set(key, fetch_error=repr(e))
            return
        if size is not None:
            self.logger.info("checkpoint fetched", job=key[0], replica=handle.index, size=size)
