"""Shipping each replica's output to the log stream, so the API can serve it from any node.

The runtimes write a replica's output to its file on this node (services/executor/logs.py);
a shipper per replica follows that file and publishes what is new, in chunks of at most
CHUNK_BYTES, each with the offset it starts at, then an end marker once the replica has
ended and its file is drained. A restarted executor asks the stream where the shipping of a
replica got to and goes on from there. Shipping never holds up the replica: a chunk that
cannot be published (the server away) is tried again on the next round, and the shipper
gives up on a replica only when the executor closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Final

import nats.errors
import nats.js.errors
import structlog

from services.runtime.logstream import (
    CHUNK_BYTES,
    END_HEADER,
    LOG_STREAM,
    OFFSET_HEADER,
    ensure_log_stream,
    log_subject,
)

if TYPE_CHECKING:
    from nats.js import JetStreamContext

log = structlog.get_logger("fairlane.executor.logship")
#: How often a running replica's file is looked at for new output.
POLL_S: Final = 0.5
#: After the replica ended, how long its runtime may take to write out the last output (the
#: Docker runtime copies the container's stream into the file).
SETTLE_S: Final = 0.3
_TROUBLE = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)


async def ship_replica(
    js: JetStreamContext,
    path: Path,
    replica: tuple[str, str, int, int],
    launched: asyncio.Event,
    finished: asyncio.Event,
) -> None:
    """Ship one replica's output (`replica`: its node, job, attempt and index; its file at
    `path`) until it has ended and everything it wrote is published."""
    subject = log_subject(*replica)
    with contextlib.suppress(*_TROUBLE):
        await ensure_log_stream(js)
    offset, done = await _shipped_so_far(js, subject)
    if done:
        return
    await launched.wait()
    while True:
        ended = finished.is_set()
        if ended:
            await asyncio.sleep(SETTLE_S)
        try:
            offset = await _ship_new(js, subject, path, offset)
            if ended:
                await js.publish(
                    subject,
                    b"",
                    stream=LOG_STREAM,
                    headers={OFFSET_HEADER: str(offset), END_HEADER: "1"},
                )
                return
        except _TROUBLE as e:
            log.warning("log shipping delayed", subject=subject, error=str(e) or repr(e))
        await asyncio.sleep(POLL_S)


async def _ship_new(js: JetStreamContext, subject: str, path: Path, offset: int) -> int:
    """Publish what the file holds beyond `offset`; returns the new offset."""
    while True:
        chunk = _read(path, offset)
        if not chunk:
            return offset
        await js.publish(subject, chunk, stream=LOG_STREAM, headers={OFFSET_HEADER: str(offset)})
        offset += len(chunk)


def _read(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)
    except FileNotFoundError:  # not created yet (a container starting)
        return b""


async def _shipped_so_far(js: JetStreamContext, subject: str) -> tuple[int, bool]:
    """Where an earlier run of this executor left the replica's shipping: the offset after
    its last chunk, and whether it had finished."""
    with contextlib.suppress(*_TROUBLE):
        last = await js.get_last_msg(LOG_STREAM, subject, direct=True)
        headers = last.headers or {}
        offset = int(headers.get(OFFSET_HEADER, "0")) + len(last.data or b"")
        return offset, END_HEADER in headers
    return 0, False
