"""Checkpoint storage of the cluster, not of a node: a job's checkpoint follows it to another node.

Two kinds, as Determined's `checkpoint_storage` (the executor's `--checkpoint-storage`):

- `object_store` (the default): the cluster's checkpoint store, reached through the executor's
  host (services/runtime/checkpoint_bucket.py: JetStream's object store, or memory in one
  process). After a replica saved (its `.checkpoint` marker was
  touched, or it told its executor through `fairlane.workload`) and after it stopped on SIGTERM,
  its executor stores the replica's checkpoint folder as one object, `<job>/replica-<i>`: a tar
  of the folder (without the `.checkpoint` and `.exit` control files). Before a later attempt's
  replica starts on a node whose folder is not that object, the executor fetches it into a new
  folder and swaps it in. A put writes its chunks, then the metadata that points at them: a
  reader sees the previous object whole until then, and a get checks the recorded digest, so a
  half-written checkpoint is never taken for a whole one.
- `shared_fs:PATH`: a folder mounted at the same path on every node; the replicas' folders are
  under it and nothing is copied.

A stored object is bounded (`--checkpoint-max-bytes`): a folder over the bound is not stored;
the executor says so on the job's timeline (`JobMessage`) and the previous object stays.

Pure parts here (names, the decisions what to fetch and store); the I/O in `ObjectCheckpoints`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from services.executor.logs import job_dir_name
from services.runtime.checkpoint_bucket import CheckpointStore

StorageKind = Literal["object_store", "shared_fs"]
#: Files of a checkpoint folder that are not the checkpoint: the marker a save touches (its
#: mtime says when this node's replica saved) and the built-in workload's exit request.
CONTROL_FILES: Final = frozenset({".checkpoint", ".exit"})
#: The default bound of one replica's stored checkpoint.
DEFAULT_MAX_BYTES: Final = 4 << 30


@dataclass(frozen=True, slots=True)
class CheckpointStorage:
    kind: StorageKind = "object_store"
    #: the shared folder (`shared_fs` only)
    path: Path | None = None
    max_bytes: int = DEFAULT_MAX_BYTES


def parse_storage(text: str, max_bytes: int = DEFAULT_MAX_BYTES) -> CheckpointStorage:
    """`object_store` or `shared_fs:PATH` (an absolute path), as `--checkpoint-storage` takes."""
    if text == "object_store":
        return CheckpointStorage("object_store", None, max_bytes)
    kind, _, path = text.partition(":")
    if kind == "shared_fs" and path.startswith("/"):
        return CheckpointStorage("shared_fs", Path(path), max_bytes)
    raise ValueError(
        f"--checkpoint-storage takes object_store or shared_fs:/ABSOLUTE/PATH, got {text!r}"
    )


def object_name(job_id: str, replica: int) -> str:
    """The object holding replica `replica`'s checkpoint of the job (every attempt's)."""
    return f"{job_dir_name(job_id)}/replica-{replica}"


def record_path(folder: Path) -> Path:
    """Where a node notes which object its copy of a replica's folder is (beside the folder,
    so it is never part of the checkpoint)."""
    return folder.with_name(folder.name + ".stored")


def to_fetch(stored_digest: str | None, local_digest: str | None) -> bool:
    """Whether a replica's folder here must be fetched before it starts: there is a stored
    checkpoint and this node's folder is not known to be it (never stored or fetched here, or
    another one since: the replica ran elsewhere)."""
    return stored_digest is not None and stored_digest != local_digest


def over_bound(size: int, max_bytes: int) -> bool:
    return size > max_bytes


@dataclass(frozen=True, slots=True)
class Stored:
    """What storing a replica's folder came to."""

    name: str
    size: int
    digest: str | None  # None: not stored (over the bound, or nothing to store)
    over_bound: bool = False


def read_record(folder: Path) -> str | None:
    try:
        data = json.loads(record_path(folder).read_text())
    except (OSError, ValueError):
        return None
    digest = data.get("digest") if isinstance(data, dict) else None
    return digest if isinstance(digest, str) else None


def write_record(folder: Path, digest: str, size: int) -> None:
    path = record_path(folder)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"digest": digest, "size": size}))
    os.replace(tmp, path)


def pack(folder: Path, into: Path) -> int:
    """Tar `folder`'s content (without the control files) into `into`; its size."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if Path(info.name).name in CONTROL_FILES else info

    with tarfile.open(into, "w") as tar:
        for entry in sorted(folder.iterdir()):
            tar.add(entry, arcname=entry.name, filter=keep)
    return into.stat().st_size


def unpack(archive: Path, folder: Path) -> None:
    """Replace `folder` with the archive's content: unpacked beside it, then swapped in, so the
    replica never sees half of it. The `data` filter refuses links out of the folder, absolute
    names and device files; where Python has none, `plain_members` checks as much first."""
    with tarfile.open(archive) as tar:
        members = None if hasattr(tarfile, "data_filter") else plain_members(tar)
        fresh = Path(tempfile.mkdtemp(prefix=folder.name + ".fetched-", dir=folder.parent))
        if members is None:
            tar.extractall(fresh, filter="data")
        else:
            tar.extractall(fresh, members=members)  # checked by plain_members
    old = folder.with_name(folder.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    fresh.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def plain_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """For a Python without tarfile's `data` filter (before 3.11.4: Debian 12's python3 is
    3.11.2), the same guard by hand, before anything is unpacked: only files and folders, each
    under the destination (no absolute name, no `..`), without setuid, setgid, sticky, group or
    other write bits, and owned by whoever unpacks (the archive's owners are another node's)."""
    members = tar.getmembers()
    for member in members:
        name = member.name
        if (
            name.startswith("/")
            or ".." in name.split("/")
            or not (member.isfile() or member.isdir())
        ):
            raise ValueError(
                f"checkpoint archive member {name!r} refused: only files and folders inside "
                "the checkpoint folder are unpacked"
            )
        member.mode &= 0o755
        member.uid, member.gid, member.uname, member.gname = os.geteuid(), os.getegid(), "", ""
    return members


class ObjectCheckpoints:
    """The store's I/O: store a replica's folder, fetch it back."""

    def __init__(self, store: CheckpointStore, max_bytes: int) -> None:
        self.objects = store
        self.max_bytes = max_bytes

    async def store(self, folder: Path, name: str) -> Stored:
        """Store the folder as object `name` (unless it is over the bound); notes the stored
        object's digest beside the folder."""
        if not folder.is_dir():
            return Stored(name, 0, None)
        with tempfile.TemporaryDirectory(prefix="fairlane-store-") as scratch:
            archive = Path(scratch) / "checkpoint.tar"
            size = await asyncio.to_thread(pack, folder, archive)
            if over_bound(size, self.max_bytes):
                return Stored(name, size, None, over_bound=True)
            with archive.open("rb") as data:
                info = await self.objects.put(name, data)
        write_record(folder, info.digest, size)
        return Stored(name, size, info.digest)

    async def fetch(self, folder: Path, name: str) -> int | None:
        """Make the folder the stored object where it is not already; the bytes fetched, or
        None when there was nothing to fetch."""
        info = await self.objects.info(name)
        if info is None or not to_fetch(info.digest, read_record(folder)):
            return None
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fairlane-fetch-") as scratch:
            archive = Path(scratch) / "checkpoint.tar"
            with archive.open("wb") as out:
                got = await self.objects.get(name, out)  # checks the digest
            await asyncio.to_thread(unpack, archive, folder)
        write_record(folder, got.digest, got.size)
        return got.size
