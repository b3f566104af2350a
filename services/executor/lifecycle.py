"""A replica's life here: started on `JobScheduled`, watched until it ends, its end reported.

- `JobScheduled` for replicas on this node: start one workload per replica; the executor of the
  job's first replica reports `JobStarted` once they are all launched.
- a workload that ends by itself: any non-zero exit is `JobFailed` (reported by whichever
  executor saw it; the id is the same, so a second report is dropped); all replicas on the
  first replica's node exiting 0 is `JobCompleted`; one that ended unobserved and left no exit
  status is `JobPreempted(reason="node_lost")`, so the job is queued again and resumes.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from events import JobCompleted, JobFailed, JobPreempted, JobScheduled, JobStarted
from events.catalogue import JobWork
from events.model import PortMapping, Replica
from services.executor.checkpoints import checkpointed, fetch_replica
from services.executor.endpoint import SOCKET_ENV
from services.executor.gang import gang_env, port_taken
from services.executor.local import LocalAttempt, LocalReplica, marker_mtime
from services.executor.logs import attempt_log_path
from services.executor.logship import ship_replica
from services.executor.nodework import desired
from services.executor.runtime import (
    SIGTERM_EXIT,
    TOKEN_ENV,
    Launch,
    checkpoint_dir,
    safe_name,
)

if TYPE_CHECKING:
    from services.executor.executor import Executor

CANNOT_START: Final = 126  # the exit code reported for a replica that could not be started


def on_scheduled(ex: Executor, e: JobScheduled) -> None:
    """A placement the fold applied (only those are relayed), with replicas here."""
    job = ex.work.jobs.get(e.job_id)
    if job is None or job.attempt != e.attempt:
        return
    mine = [
        (i, r)
        for i, r in enumerate(job.held)
        if r.node == ex.node and r in e.replicas and job.attempt == e.attempt
    ]
    if not mine:
        return
    announce = not e.scale_up and job.held[0].node == ex.node
    fresh = (job.job_id, e.attempt) not in ex.attempts
    att = ex.attempt(job.job_id, e.attempt, None if e.scale_up else e.id, announce, mine[0][0])
    started = 0
    for index, replica in mine:
        if replica in att.replicas:
            continue  # a repeated decision: already started
        lr = ex.add(att, index, replica)
        ex.spawn(run_replica(ex, lr, launch_of(ex, job, index, replica)))
        started += 1
    if not started:
        return
    if announce and fresh:
        ex.spawn(announce_started(ex, att))
    ex.logger.info(
        "scaling up" if e.scale_up else "starting",
        job=job.job_id,
        attempt=e.attempt,
        replicas=[i for i, _ in mine],
    )


def launch_of(ex: Executor, job: JobWork, index: int, replica: Replica) -> Launch:
    """Everything the runtime needs to start replica `index` of the job's current attempt."""
    spec = job.spec
    if spec is None:  # relayed with every placement: only a broken relay leaves it out
        raise ValueError(f"no spec was relayed for job {job.job_id!r}")
    directory = checkpoint_dir(ex.checkpoints_root, job.job_id, index)
    own = dict(entry.partition("=")[::2] for entry in spec.env)
    env = {
        **own,
        "FAIRLANE_JOB_ID": job.job_id,
        "FAIRLANE_ATTEMPT": str(job.attempt),
        "FAIRLANE_CHECKPOINT_DIR": str(directory),
        **gang_env(job, index),
        "FAIRLANE_NODE": ex.node,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in replica.gpus),
        # NVML numbers GPUs in PCI bus order; make CUDA use the same numbering.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if job.attempt > 1:
        env["FAIRLANE_RESUMED"] = "1"
    env.update(ports_env(spec.ports))
    if ex.endpoint is not None:
        env[SOCKET_ENV] = str(ex.endpoint.path)
        env[TOKEN_ENV] = secrets.token_urlsafe(24)
    return Launch(
        job_id=job.job_id,
        attempt=job.attempt,
        replica=index,
        gpus=replica.gpus,
        command=spec.command,
        image=spec.image,
        env=env,
        checkpoint_dir=directory,
        run_dir=ex.data_dir / "runs" / safe_name(job.job_id),
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


async def run_replica(ex: Executor, lr: LocalReplica, launch: Launch | None) -> None:
    """Start (or adopt) one replica, wait for it to end, then deal with its end."""
    if ex.runtime.real:  # its output, to the log stream as it comes
        ex.spawn(ship_replica(ex, lr))
    if lr.workload is None:
        if launch is None:
            return
        if lr.stopping:  # asked to stop before it even started: do not start it
            lr.end(SIGTERM_EXIT)
            replica_ended(ex, lr)
            return
        att = ex.attempts.get(lr.key)
        baseline = att.baseline_mtime if att is not None else None
        lr.token = launch.env.get(TOKEN_ENV, "")
        await fetch_replica(ex, lr)  # a later attempt: the checkpoint it resumes from
        lr.stored_mark = marker_mtime(launch.checkpoint_dir)  # older saves are not its own
        if (taken := master_port_taken(ex, launch)) is not None:
            ex.logger.error("the rendezvous port is taken", job=lr.job_id, port=taken)
            lr.failure = (
                f"the rendezvous port {taken} (MASTER_PORT) on {ex.node} is taken by another "
                "process: nothing was started; the next attempt gets another port"
            )
            lr.end(CANNOT_START)
            replica_ended(ex, lr)
            return
        try:
            lr.workload = await ex.runtime.start(launch, ex.node, baseline)
        except Exception:  # the node cannot start it (a full disk, ...): the attempt fails
            ex.logger.exception("could not start", job=lr.job_id, replica=lr.index)
            lr.end(CANNOT_START)
            replica_ended(ex, lr)
            return
        ex.save_records()
    lr.launched.set()
    code = await lr.workload.wait()
    lr.end(code)
    ex.logger.info(
        "workload ended",
        job=lr.job_id,
        attempt=lr.attempt,
        replica=lr.index,
        exit_code=code,
        stopped=lr.stopping,
    )
    replica_ended(ex, lr)


def master_port_taken(ex: Executor, launch: Launch) -> int | None:
    """The attempt's rendezvous port, where replica 0 is to start here and something already
    listens on it. The relay never gives two running attempts the same port at one address,
    but a process outside Fairlane may hold it: then the attempt fails at once with a reason
    that says so, instead of its replicas waiting for a master that cannot bind."""
    port = launch.env.get("MASTER_PORT")
    if launch.replica != 0 or not ex.runtime.real or port is None:
        return None
    return int(port) if port_taken(int(port)) else None


def replica_ended(ex: Executor, lr: LocalReplica) -> None:
    if lr.stopping:
        return  # the stop in progress reports it
    if not desired(ex.work.jobs.get(lr.job_id), lr.attempt, lr.replica):
        ex.drop(lr)  # the log has moved on: nothing to report
        return
    ex.spawn(report_end(ex, lr))


async def report_end(ex: Executor, lr: LocalReplica) -> None:
    att = ex.attempts.get(lr.key)
    if att is None:
        return
    await att.started.wait()
    job = ex.work.jobs.get(lr.job_id)
    if job is None or lr.stopping or not desired(job, lr.attempt, lr.replica):
        return
    base = f"{lr.job_id}/{lr.attempt}"
    if lr.exit_code is None:
        # It ended while nobody watched and left no exit status (a reboot, or its group was
        # killed from outside): the attempt is lost, the job goes back to the queue.
        await ex.publish(
            JobPreempted(
                id=f"{base}/lost",
                time=time.time(),
                actor=ex.config.actor,
                job_id=lr.job_id,
                attempt=lr.attempt,
                reason="node_lost",
                checkpointed=checkpointed(ex, att),
                gpu_utilization=ex.attempt_utilization(lr.job_id, lr.attempt),
            )
        )
    elif lr.exit_code != 0:
        await ex.publish(
            JobFailed(
                id=f"{base}/failed",
                time=time.time(),
                actor=ex.config.actor,
                causation=att.scheduled_id,
                job_id=lr.job_id,
                attempt=lr.attempt,
                exit_code=lr.exit_code,
                reason=failure_reason(ex, lr),
                gpu_utilization=ex.attempt_utilization(lr.job_id, lr.attempt),
            )
        )
    elif job.held[0].node == ex.node and all(
        r.ended and r.exit_code == 0 and not r.stopping
        for r in att.replicas.values()
        if desired(job, r.attempt, r.replica)
    ):
        await ex.publish(
            JobCompleted(
                id=f"{base}/completed",
                time=time.time(),
                actor=ex.config.actor,
                causation=att.scheduled_id,
                job_id=lr.job_id,
                attempt=lr.attempt,
                gpu_utilization=ex.attempt_utilization(lr.job_id, lr.attempt),
            )
        )


#: What an exit code says where the shell's conventions give it a meaning.
EXIT_MEANINGS: Final = {
    125: "the container engine could not run it",
    126: "the command cannot be executed",
    127: "the command was not found",
    137: "killed",
}
LAST_LINE_BYTES: Final = 4096


def failure_reason(ex: Executor, lr: LocalReplica) -> str:
    """Why a replica failed: its exit code, what the code means, and what the runtime knows
    (a container that could not be made) or else the last line the workload wrote."""
    said = f"replica {lr.index} on {ex.node} exited with code {lr.exit_code}"
    if lr.exit_code in EXIT_MEANINGS:
        said += f" ({EXIT_MEANINGS[lr.exit_code]})"
    detail = lr.workload.failure if lr.workload is not None else lr.failure
    if not detail:
        detail = last_line(attempt_log_path(ex.data_dir, lr.job_id, lr.attempt, lr.index))
    return f"{said}: {detail}" if detail else said


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


async def announce_started(ex: Executor, att: LocalAttempt) -> None:
    for lr in list(att.replicas.values()):
        await lr.launched.wait()
    job = ex.work.jobs.get(att.job_id)
    if job is not None and job.attempt == att.attempt:
        await ex.publish(
            JobStarted(
                id=f"{att.job_id}/{att.attempt}/started",
                time=time.time(),
                actor=ex.config.actor,
                causation=att.scheduled_id,
                job_id=att.job_id,
                attempt=att.attempt,
                resumed=att.attempt > 1,
            )
        )
    att.started.set()
