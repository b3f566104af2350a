"""What a running embedded cluster writes about itself: `<data>/cluster.json`.

Its own module, free of what starts clusters, because every command that finds the running
cluster (the HTTP client's default target, `down`, `status`, `audit`) reads it, and each
command pays for its imports.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.runtime.processes import pid_exists

#: where `fairlane up` keeps a cluster's files unless told otherwise
DEFAULT_DATA_DIR = Path(".fairlane")


class ClusterFile(msgspec.Struct):
    nats_url: str
    postgres_uri: str
    data_dir: str
    node: str
    #: process ids of what this cluster started and must stop (nats-server included; the
    #: services are the supervisor's: see `supervisor_status`)
    pids: dict[str, int]
    started_at: float
    #: the HTTP API, and the file holding its admin token (mode 0600)
    api_url: str = ""
    admin_token_file: str = ""
    #: where the NATS users' credentials are ("" for a server not started here)
    credentials_dir: str = ""


def cluster_file(data_dir: Path) -> Path:
    return data_dir / "cluster.json"


def read_cluster(data_dir: Path) -> ClusterFile | None:
    """The running cluster recorded in `data_dir`, or None if none runs there."""
    path = cluster_file(data_dir)
    try:
        info = msgspec.json.decode(path.read_bytes(), type=ClusterFile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not any(pid_exists(pid) for pid in info.pids.values()):
        return None
    return info


def stopped(info: ClusterFile) -> list[str]:
    """What this cluster started that no longer runs, by name."""
    return [name for name, pid in info.pids.items() if not pid_exists(pid)]
