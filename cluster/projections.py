"""Making a cluster's read models again from its whole log (`fairlane projections rebuild`),
as its projector's user: a projector running beside it notices and goes on from the rebuilt
position."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from cluster.cluster_file import ClusterFile
from services.projector.service import DEFAULT_NAME as PROJECTOR_NAME
from services.projector.service import Projector
from services.runtime.auth import Credentials, load_credentials
from services.runtime.connection import NotAuthorized, connect
from services.runtime.eventlog import JetStreamLog

#: the read models' position name a cluster's projector writes
DEFAULT_NAME: Final = PROJECTOR_NAME
#: what reaching the log can fail with
UNREACHABLE: Final = (NotAuthorized, ConnectionError, OSError, TimeoutError)


def projector_credentials(running: ClusterFile | None, nats: str) -> Credentials | None:
    """The projector's credentials of the cluster `running`, where `nats` is its server (else
    None: FAIRLANE_NATS_CREDENTIALS, if set)."""
    if running is not None and running.credentials_dir and nats == running.nats_url:
        return load_credentials(Path(running.credentials_dir) / "projector.json")
    return None


async def rebuild(nats: str, postgres: str, credentials: Credentials | None, name: str) -> int:
    """The read models `name` emptied and projected again; the last event projected."""
    nc = await connect(nats, "fairlane-rebuild", retry_for=5, credentials=credentials)
    log = JetStreamLog(nc)
    try:
        return await Projector(log, postgres, name=name).rebuild()
    finally:
        await log.nc.close()
