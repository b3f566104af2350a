"""What the runtime is given to start one replica (`Launch`), from the job as relayed: pure.

The environment holds the job's own variables, where it checkpoints, its place in its gang
(`gang.gang_env`), its GPUs and ports; the actuator adds the endpoint's socket and token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from events.catalogue import JobWork
from events.model import PortMapping, Replica
from services.executor.gang import gang_env
from services.executor.runtime import Launch, checkpoint_dir, safe_name


@dataclass(frozen=True, slots=True)
class Site:
    """Where a node's replicas run: the node, and its checkpoint and data folders."""

    node: str
    checkpoints: Path
    data_dir: Path


def launch_of(job: JobWork, index: int, replica: Replica, site: Site) -> Launch:
    """Everything the runtime needs to start replica `index` of the job's current attempt."""
    node, checkpoints, data_dir = site.node, site.checkpoints, site.data_dir
    spec = job.spec
    if spec is None:  # relayed with every placement: only a broken relay leaves it out
        raise ValueError(f"no spec was relayed for job {job.job_id!r}")
    directory = checkpoint_dir(checkpoints, job.job_id, index)
    own = dict(entry.partition("=")[::2] for entry in spec.env)
    env = {
        **own,
        "FAIRLANE_JOB_ID": job.job_id,
        "FAIRLANE_ATTEMPT": str(job.attempt),
        "FAIRLANE_CHECKPOINT_DIR": str(directory),
        **gang_env(job, index),
        "FAIRLANE_NODE": node,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in replica.gpus),
        # NVML numbers GPUs in PCI bus order; make CUDA use the same numbering.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if job.attempt > 1:
        env["FAIRLANE_RESUMED"] = "1"
    env.update(ports_env(spec.ports))
    return Launch(
        job_id=job.job_id,
        attempt=job.attempt,
        replica=index,
        gpus=replica.gpus,
        command=spec.command,
        image=spec.image,
        env=env,
        checkpoint_dir=directory,
        run_dir=data_dir / "runs" / safe_name(job.job_id),
        working_dir=Path(spec.working_dir) if spec.working_dir else None,
        ports=spec.ports,
        volumes=spec.volumes,
    )


def ports_env(ports: tuple[PortMapping, ...]) -> dict[str, str]:
    """What a workload is told of its ports: every `host:container`, and the port to listen
    on, `FAIRLANE_PORT` (the first one's host port: a process, or a container on the host's
    network, listens on the node's port itself; a container with its ports mapped is told its
    own instead, see `docker.container_config`)."""
    if not ports:
        return {}
    return {
        "FAIRLANE_PORTS": ",".join(f"{p.host}:{p.container}" for p in ports),
        "FAIRLANE_PORT": str(ports[0].host),
    }
