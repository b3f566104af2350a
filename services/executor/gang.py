"""A replica's place in its gang: the rendezvous variables torchrun and torch.distributed read.

Pure: the job as relayed (`JobWork`: every replica it holds, in the fold's order, and the
attempt's `Rendezvous`) and the replica's index in, its environment out. Every replica of an
attempt is one process (one rank), so `RANK` is the replica's index and `WORLD_SIZE` the
replicas held; `NODE_RANK` numbers the nodes in the order their first replica comes, and
`LOCAL_RANK` / `LOCAL_WORLD_SIZE` count the replicas on the same node. The master is replica
0's node and the relay's port for this attempt, the same for every replica (a new port for the
next attempt, chosen from the log: services/nodewatch/work.py).
"""

from __future__ import annotations

import contextlib
import socket

from events.catalogue import JobWork


def gang_env(job: JobWork, index: int) -> dict[str, str]:
    """The rendezvous variables of replica `index` of the job's current attempt."""
    held = job.held
    node = held[index].node
    nodes = list(dict.fromkeys(r.node for r in held))
    here = [i for i, r in enumerate(held) if r.node == node]
    env = {
        "FAIRLANE_REPLICA": str(index),
        "RANK": str(index),
        "WORLD_SIZE": str(len(held)),
        "NODE_RANK": str(nodes.index(node)),
        "LOCAL_RANK": str(here.index(index)),
        "LOCAL_WORLD_SIZE": str(len(here)),
    }
    meet = job.rendezvous
    if meet is not None and meet.attempt == job.attempt:
        env["MASTER_ADDR"] = meet.address
        env["MASTER_PORT"] = str(meet.port)
    return env


def port_taken(port: int) -> bool:
    """Whether something on this machine listens on `port` already (bound as torch's store
    binds it, with SO_REUSEADDR, so a socket of an earlier attempt in TIME_WAIT is no bar)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):
            probe.bind(("", port))
            return False
    return True
