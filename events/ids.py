"""Every id derived from a command's inputs or a node's report, said once.

An event's id is its `Nats-Msg-Id`: the same decision made twice (a retry, a restarted
service) gets the same id and the stream drops the repeat. Ids of commands that may be given
again later on purpose (pause, resume, configuration) carry `at`, the log position they were
decided from, so a later, deliberate repeat is a new event.
"""

from __future__ import annotations


def submitted(job_id: str, after: int = 0) -> str:
    """`after`: for a job id used again after its first submission was rejected, the log
    position of that rejection (0 for a first submission)."""
    return f"{job_id}/submitted" if not after else f"{job_id}/submitted/after-{after}"


def admission(job_id: str, after: int = 0) -> str:
    return f"{job_id}/admission" if not after else f"{job_id}/admission/after-{after}"


def cancelled(job_id: str) -> str:
    return f"{job_id}/cancelled"


def paused(job_id: str, at: int) -> str:
    return f"{job_id}/paused/{at}"


def resumed(job_id: str, at: int) -> str:
    return f"{job_id}/resumed/{at}"


def started(job_id: str, attempt: int) -> str:
    return f"{job_id}/{attempt}/started"


def completed(job_id: str, attempt: int) -> str:
    return f"{job_id}/{attempt}/completed"


def failed(job_id: str, attempt: int) -> str:
    return f"{job_id}/{attempt}/failed"


def stopped(request_id: str) -> str:
    """The executor's answer to a preemption request."""
    return f"{request_id}/done"


def shut_down(job_id: str, attempt: int) -> str:
    """An attempt stopped for a cluster shut down (no request precedes it)."""
    return f"{job_id}/{attempt}/shutdown"


def on_node(report_id: str, node: str) -> str:
    """The report of one node's own replicas of a stop that spans several nodes: every node
    but the stop's first (which keeps the stop's own id) reports under one of these."""
    return f"{report_id}/{node}"


def lost(job_id: str, attempt: int) -> str:
    """A replica that ended unobserved and left no exit status: the stop of its attempt,
    which each node reports for its own replicas under this and its name (`on_node`)."""
    return f"{job_id}/{attempt}/lost"


def checkpoint_over_bound(
    job_id: str, attempt: int, replica: int, saves: int, mark: float | None
) -> str:
    return f"{job_id}/{attempt}/{replica}/checkpoint-over-bound/{saves}/{mark}"


def checkpoint_not_fetched(job_id: str, attempt: int, replica: int) -> str:
    return f"{job_id}/{attempt}/{replica}/checkpoint-not-fetched"


def checkpointed(job_id: str, attempt: int, mark: int) -> str:
    return f"{job_id}/{attempt}/checkpoint/{mark}"


def node_registered(node: str, boot: str | int, again: int = 0) -> str:
    """`boot`: what tells one start of the node's executor from another; `again`: how often
    that start registered again after its node was declared lost."""
    return f"{node}/registered/{boot}" + (f"/{again}" if again else "")


def node_lost(node: str, at: int) -> str:
    return f"{node}/lost/{at}"


def cluster_configured(at: int) -> str:
    return f"cluster/{at}"


def scheduling_held(held: bool, at: int) -> str:
    return f"held/{held}/{at}"


def pool_configured(pool: str, at: int) -> str:
    return f"pool/{pool}/{at}"


def project_configured(project: str, at: int) -> str:
    return f"project/{project}/{at}"


def quota_crossed(project: str, pool: str, at: int) -> str:
    return f"quota/{project}/{pool}/{at}"


def node_cordoned(node: str, at: int) -> str:
    return f"node/{node}/cordoned/{at}"


def node_uncordoned(node: str, at: int) -> str:
    return f"node/{node}/uncordoned/{at}"


def priority_changed(job_id: str, at: int) -> str:
    return f"{job_id}/priority/{at}"


def volumes_configured(at: int) -> str:
    return f"volumes/{at}"


def from_workload(job_id: str, attempt: int, own_id: str) -> str:
    """An event a workload sent through its executor, by the workload's own id (a retry is
    dropped)."""
    return f"{job_id}/{attempt}/workload/{own_id}"
