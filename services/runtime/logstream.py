"""The workloads' output on the bus: a bounded JetStream stream of its own, apart from the log.

Each node's executor publishes what each replica writes, in chunks, to

    fairlane.logs.<node>.<job>.<attempt>.<replica>

(the node in the subject lets the server hold each executor to its own node's output), and
the API reads it back for `fairlane logs` on any deployment. Output is not an event: the
stream is bounded by size and age and drops the oldest output first (`discard: old`), while
the event log refuses rather than forgets. Every chunk carries the byte offset it starts at
(`Fairlane-Offset`), so a chunk shipped twice (an executor restarted mid-way) is recognised
and skipped by the reader; an empty message with `Fairlane-Log-End` says a replica's output
is complete.
"""

from __future__ import annotations

from typing import Final

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

LOG_STREAM: Final = "FAIRLANE_LOGS"
LOG_PREFIX: Final = "fairlane.logs"
OFFSET_HEADER: Final = "Fairlane-Offset"
END_HEADER: Final = "Fairlane-Log-End"
#: The most one message carries (well under the server's 1 MiB message limit).
CHUNK_BYTES: Final = 64 << 10
DEFAULT_LOG_MAX_BYTES: Final = 1 << 30
DEFAULT_LOG_MAX_AGE_S: Final = 7 * 24 * 3600.0


def log_subject(node: str, job_id: str, attempt: int, replica: int) -> str:
    return f"{LOG_PREFIX}.{node}.{job_id}.{attempt}.{replica}"


def attempt_filter(job_id: str, attempt: int) -> str:
    """Every replica's output of one attempt, on whichever nodes ran them."""
    return f"{LOG_PREFIX}.*.{job_id}.{attempt}.*"


def replica_of(subject: str) -> int:
    return int(subject.rsplit(".", 1)[1])


def log_stream_config(
    max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    max_age_s: float = DEFAULT_LOG_MAX_AGE_S,
    replicas: int = 1,
) -> StreamConfig:
    return StreamConfig(
        name=LOG_STREAM,
        subjects=[f"{LOG_PREFIX}.>"],
        max_bytes=max_bytes,
        max_age=max_age_s,
        max_msg_size=CHUNK_BYTES + 4096,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        num_replicas=replicas,
        allow_direct=True,  # an executor asks where its shipping of a replica got to
        duplicate_window=120.0,
    )


async def ensure_log_stream(js: JetStreamContext) -> None:
    """Create the stream where nobody provisioned it (a server without authentication)."""
    try:
        await js.stream_info(LOG_STREAM)
    except NotFoundError:
        await js.add_stream(log_stream_config())
