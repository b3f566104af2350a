"""The Docker runtime: each replica is a container, started and watched through aiodocker.

- The job's image and command, the replica's environment, and its GPUs: a device request for
  the assigned GPUs' UUIDs (capability `gpu`) where the node's GPUs came from NVML, plus
  `NVIDIA_VISIBLE_DEVICES` (those UUIDs) and `CUDA_VISIBLE_DEVICES` (0..n-1: inside the
  container only the requested GPUs exist, numbered from 0).
- The job's checkpoint folder is mounted at the same path on every attempt (and is the
  working directory); the workload events socket's folder is mounted too.
- `HostConfig.Init`: docker-init is PID 1 and passes SIGTERM on to the workload.
- Labels name the node, job, attempt and replica: a restarted executor finds its containers
  by label (`found`), running or exited, and reads how an exited one ended from the engine.
- The container's output is copied into the attempt's log file (`services.executor.logs`),
  from the start again whenever the executor (re)attaches, so the file never holds a line
  twice. A container is removed only once the executor is done with it (`discard`), so an
  exit code survives an executor restart.
- The job's volumes (`--volume`, checked by admission against the cluster's allowlist) are
  bind mounts, read-only unless `:rw`. Only the node sees its own folders, so here a host
  path must exist and lead to itself (no symlink on the way: the allowlist is of paths, and
  a link under an allowed folder could point anywhere), and a container path may not cover
  Fairlane's own mounts or sit inside them; else the replica is not started, saying why.
- A container that cannot be created or started (an image that does not exist, a command that
  is not there) ends at once with exit code 125 (the engine's own convention) and the
  engine's message as its `failure`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiodocker
import msgspec
import structlog
from aiodocker.exceptions import DockerError

from policy.commands.volumes import is_under, normalized
from services.executor.identity import (
    WorkloadUser,
    can_switch_users,
    job_user,
    own,
    pass_through,
)
from services.executor.runtime import TOKEN_ENV, Launch, ProcessRecord, Workload

log = structlog.get_logger("fairlane.executor.docker")

LABEL: Final = "fairlane"
CANNOT_RUN: Final = 125  # docker run's exit status when the engine cannot run the container
#: The engine said the container does not exist (or is gone).
NOT_FOUND: Final = 404
WAIT_RETRY_S: Final = 1.0


def container_name(node: str, launch: Launch) -> str:
    raw = f"fairlane-{node}-{launch.job_id}-{launch.attempt}-{launch.replica}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", raw)[:200]


def labels(node: str, launch: Launch, checkpoint_mtime: float | None) -> dict[str, str]:
    found = {
        f"{LABEL}.node": node,
        f"{LABEL}.job": launch.job_id,
        f"{LABEL}.attempt": str(launch.attempt),
        f"{LABEL}.replica": str(launch.replica),
        f"{LABEL}.gpus": ",".join(str(g) for g in launch.gpus),
        f"{LABEL}.started_at": repr(time.time()),
        f"{LABEL}.log_file": str(launch.log_file),
    }
    if checkpoint_mtime is not None:
        found[f"{LABEL}.checkpoint_mtime"] = repr(checkpoint_mtime)
    return found


@dataclass(frozen=True)
class ContainerHost:
    """What the node gives every container: its GPUs by index (from NVML; empty where GPUs
    were declared, and then no device is requested), the network, and folders to mount."""

    gpu_uuids: tuple[str, ...]
    network: str = "host"
    mounts: tuple[Path, ...] = ()
    #: the uid:gid the container runs as (None: the image's own user; `--insecure-same-user`)
    user: WorkloadUser | None = None


def container_config(
    launch: Launch, node: str, checkpoint_mtime: float | None, on: ContainerHost
) -> dict[str, Any]:
    """The Engine API's create body for one replica."""
    gpu_uuids, network, mounts = on.gpu_uuids, on.network, on.mounts
    env = dict(launch.env)
    if launch.gpus:
        assigned = [gpu_uuids[g] for g in launch.gpus if g < len(gpu_uuids)]
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(assigned or [str(g) for g in launch.gpus])
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(launch.gpus)))
    host: dict[str, Any] = {
        "Init": True,
        "NetworkMode": network,
        "Binds": [f"{launch.checkpoint_dir}:{launch.checkpoint_dir}"]
        + [f"{path}:{path}" for path in mounts],
    }
    exposed: dict[str, dict[str, Any]] = {}
    if launch.ports and network != "host":
        # published as `docker run -p HOST:CONTAINER` does; on the host's network (the
        # default) the workload listens on the node's port itself and nothing is mapped
        exposed = {f"{p.container}/tcp": {} for p in launch.ports}
        host["PortBindings"] = {
            f"{p.container}/tcp": [{"HostPort": str(p.host)}] for p in launch.ports
        }
        env["FAIRLANE_PORT"] = str(launch.ports[0].container)
    if on.user is not None:
        # as the job's own uid (`identity`), never privileged, no setuid way back to root:
        # the job's checkpoint folder (its own) and the events socket are all it gets of the
        # node, so another job's files, the credentials and the Docker socket stay out
        host["Privileged"] = False
        host["SecurityOpt"] = ["no-new-privileges"]
    if launch.gpus and gpu_uuids:
        host["DeviceRequests"] = [
            # no Driver: the engine picks the one that offers `gpu`, as `docker run --gpus` does
            {"DeviceIDs": [gpu_uuids[g] for g in launch.gpus], "Capabilities": [["gpu"]]}
        ]
    if launch.volumes:
        host["Mounts"] = [
            {
                "Type": "bind",
                "Source": normalized("host path", v.host),
                "Target": normalized("container path", v.container),
                "ReadOnly": v.read_only,
            }
            for v in launch.volumes
        ]
    config: dict[str, Any] = {
        "Image": launch.image,
        "Env": [f"{k}={v}" for k, v in sorted(env.items())],
        "Labels": labels(node, launch, checkpoint_mtime),
        "HostConfig": host,
    }
    if exposed:
        config["ExposedPorts"] = exposed
    if on.user is not None:
        config["User"] = f"{on.user.uid}:{on.user.gid}"
    if launch.working_dir is not None:  # else the image's own
        config["WorkingDir"] = str(launch.working_dir)
    if launch.command:
        config["Cmd"] = list(launch.command)
    return config


def volume_problem(launch: Launch, ours: tuple[Path, ...]) -> str | None:
    """Why the replica's volumes cannot be mounted on this node (the first reason), or None.
    `ours`: the folders Fairlane mounts itself (a volume may neither hide nor enter them)."""
    taken = [str(launch.checkpoint_dir), *map(str, ours)]
    for v in launch.volumes:
        about = f"volume {v.text()}"
        try:
            host = normalized(f"{about}: host path", v.host)
            container = normalized(f"{about}: container path", v.container)
        except ValueError as e:  # admission refuses these: only a forged spec gets here
            return str(e)
        if not os.path.isdir(host):
            return f"{about}: no folder {host} on this node"
        real = os.path.realpath(host)
        if real != host:
            return f"{about}: {host} leads through a symlink to {real}; give the real path"
        for path in taken:
            if is_under(container, path) or is_under(path, container):
                return f"{about}: the container path would cover Fairlane's mount {path}"
    return None


def record_of(info: dict[str, Any]) -> ProcessRecord | None:
    """A container (as listed by the engine) as the record of the replica it runs; None for a
    container whose labels are not Fairlane's."""
    tags: dict[str, str] = info.get("Labels") or {}
    try:
        gpus = tuple(int(g) for g in tags[f"{LABEL}.gpus"].split(",") if g)
        mtime = tags.get(f"{LABEL}.checkpoint_mtime")
        return ProcessRecord(
            job_id=tags[f"{LABEL}.job"],
            attempt=int(tags[f"{LABEL}.attempt"]),
            replica=int(tags[f"{LABEL}.replica"]),
            node=tags[f"{LABEL}.node"],
            gpus=gpus,
            started_at=float(tags.get(f"{LABEL}.started_at", "0")),
            checkpoint_mtime=float(mtime) if mtime else None,
            runtime="docker",
            container=str(info["Id"]),
            log_file=tags.get(f"{LABEL}.log_file", ""),
        )
    except (KeyError, ValueError):
        return None


@dataclass(eq=False)
class DockerWorkload:
    """One replica's container (or the failure to make one)."""

    runtime: DockerRuntime
    _record: ProcessRecord | None
    log_file: Path | None
    _failure: str | None = None
    _code: int | None = None
    _ended: bool = False
    _wait: asyncio.Task[int | None] | None = None
    _copy: asyncio.Task[None] | None = None

    @property
    def record(self) -> ProcessRecord | None:
        return self._record

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def container(self) -> str:
        return self._record.container if self._record is not None else ""

    def alive(self) -> bool:
        return not self._ended

    async def wait(self) -> int | None:
        if self._wait is None:
            self._wait = asyncio.ensure_future(self._wait_once())
        return await asyncio.shield(self._wait)

    async def _wait_once(self) -> int | None:
        if not self.container:
            self._ended = True
            return self._code
        if self.log_file is not None and self._copy is None:
            self._copy = asyncio.ensure_future(self.runtime.copy_output(self))
        code = await self.runtime.exit_code(self.container)
        if self._copy is not None:
            # the stream ends with the container; a little time for the last lines
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.shield(self._copy)
        self._ended, self._code = True, code
        return code

    def signal(self, sig: int) -> None:
        if self.container and not self._ended:
            self.runtime.spawn(self.runtime.kill(self.container, signal.Signals(sig).name))

    def discard(self) -> None:
        if self._copy is not None:
            self._copy.cancel()
        if self.container:
            self.runtime.spawn(self.runtime.remove(self.container))


class DockerRuntime:
    """Replicas as containers of a Docker engine (`url`: its socket; None: the default)."""

    name = "docker"
    real = True
    saves = True

    def __init__(
        self,
        url: str | None = None,
        *,
        gpu_uuids: tuple[str, ...] = (),
        network: str = "host",
        mounts: tuple[Path, ...] = (),
        same_user: bool = True,
    ) -> None:
        self.url = url
        self.same_user = same_user
        self.gpu_uuids = gpu_uuids
        self.network = network
        self.mounts = mounts
        self._docker: aiodocker.Docker | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def user(self, launch: Launch) -> WorkloadUser | None:
        """Whose uid the container runs as (None: the image's own user). As root, the job's
        own, which its checkpoint folder is given to; otherwise the executor's own uid, which
        may write that folder: a container reaches nothing of the node but its mounts (its own
        folder, the events socket), so unlike a process it needs no uid of its own to be kept
        from the data folder, and it refuses nothing."""
        if self.same_user:
            return None
        if can_switch_users():
            return job_user(launch.job_id)
        return WorkloadUser(os.getuid(), os.getgid())

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:  # made on first use: it needs the running loop
            self._docker = aiodocker.Docker(url=self.url)
        return self._docker

    async def start(self, launch: Launch, node: str, checkpoint_mtime: float | None) -> Workload:
        if not launch.image:
            return self._failed(launch, "the job names no image: the Docker runtime needs one")
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        launch.log_file.write_bytes(b"")
        user = self.user(launch)
        if user is not None and can_switch_users():
            pass_through(launch.checkpoint_dir.parent.parent)
            own(launch.checkpoint_dir.parent, user)
            own(launch.checkpoint_dir, user, recursive=True)
        problem = volume_problem(launch, self.mounts)
        if problem is not None:
            return self._failed(launch, problem)
        on = ContainerHost(self.gpu_uuids, self.network, self.mounts, user)
        config = container_config(launch, node, checkpoint_mtime, on)
        name = container_name(node, launch)
        try:
            container = await self._create(config, name)
        except DockerError as e:
            return self._failed(launch, f"cannot create a container of {launch.image}: {e.message}")
        try:
            await container.start()
        except DockerError as e:
            await self.remove(container.id)
            return self._failed(
                launch, f"cannot start {launch.command or launch.image}: {e.message}"
            )
        info = await container.show()
        record = record_of({"Id": container.id, "Labels": info["Config"]["Labels"]})
        assert record is not None  # made with our labels just now
        token = launch.env.get(TOKEN_ENV, "")
        record = msgspec.structs.replace(record, token=token)
        log.info("container started", job=launch.job_id, container=container.id[:12], name=name)
        return DockerWorkload(self, record, launch.log_file)

    async def _create(
        self, config: dict[str, Any], name: str
    ) -> aiodocker.containers.DockerContainer:
        try:
            return await self.docker.containers.create(config, name=name)
        except DockerError as e:
            if e.status != 409:
                raise
        # A container of that name is left from an earlier try of the same replica: ours.
        await self.remove(name)
        return await self.docker.containers.create(config, name=name)

    def _failed(self, launch: Launch, why: str) -> Workload:
        log.error("cannot run the container", job=launch.job_id, reason=why)
        with contextlib.suppress(OSError):
            launch.run_dir.mkdir(parents=True, exist_ok=True)
            with launch.log_file.open("a") as out:
                out.write(f"fairlane: {why}\n")
        return DockerWorkload(self, None, None, _failure=why, _code=CANNOT_RUN, _ended=True)

    async def found(self, records_path: Path, node: str) -> list[ProcessRecord]:
        listed = await self.docker.containers.list(
            all=True, filters=f'{{"label": ["{LABEL}.node={node}"]}}'
        )
        records = []
        for container in listed:
            record = record_of({"Id": container.id, "Labels": container["Labels"]})
            if record is None:
                continue
            info = await container.show()
            env = [item.partition("=") for item in info["Config"].get("Env") or []]
            token = next((value for key, _, value in env if key == TOKEN_ENV), "")
            records.append(msgspec.structs.replace(record, token=token))
        return records

    def adopt(self, record: ProcessRecord) -> Workload:
        log_file = Path(record.log_file) if record.log_file else None
        return DockerWorkload(self, record, log_file)

    def adopt_unrecorded(self, launch: Launch) -> Workload | None:
        return None

    async def exit_code(self, container: str) -> int | None:
        """Once the container has ended: its exit code; None if it is gone (removed by
        someone else), so how it ended is unknown."""
        while True:
            try:
                result = await self.docker.containers.container(container).wait()
                return int(result["StatusCode"])
            except DockerError as e:
                if e.status == NOT_FOUND:
                    return None
                log.warning("waiting for a container failed, again", error=e.message)
            except (TimeoutError, OSError) as e:  # the engine restarting
                log.warning("waiting for a container failed, again", error=str(e))
            await asyncio.sleep(WAIT_RETRY_S)

    async def copy_output(self, workload: DockerWorkload) -> None:
        """The container's output into its log file, from the start."""
        assert workload.log_file is not None
        container = self.docker.containers.container(workload.container)
        try:
            with workload.log_file.open("w") as out:
                async for chunk in container.log(stdout=True, stderr=True, follow=True):
                    out.write(chunk)
                    out.flush()
        except (DockerError, OSError) as e:
            log.warning("copying a container's output stopped", error=str(e))

    async def kill(self, container: str, sig: str) -> None:
        with contextlib.suppress(DockerError):  # it ended meanwhile
            await self.docker.containers.container(container).kill(signal=sig)

    async def remove(self, container: str) -> None:
        try:
            await self.docker.containers.container(container).delete(force=True)
        except DockerError as e:
            if e.status != NOT_FOUND:
                log.warning("cannot remove a container", container=container, error=e.message)

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
