"""Shipping each replica's output to the log stream, so the API can serve it from any node.

The runtimes write a replica's output to its file on this node (services/executor/logs.py);
a shipper per replica follows that file and publishes what is new, in chunks of at most
CHUNK_BYTES, each with the offset it starts at, then an end marker once the replica has
ended and its file is drained. A restarted executor asks where the shipping of a replica got
to and goes on from there. It ships through its host's output (the stream on a cluster, a list
in one process). Shipping never holds up the replica: a chunk that
cannot be published (the server away) is tried again on the next round, and the shipper
gives up on a replica only when the executor closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Final

import nats.errors
import nats.js.errors
import structlog

from services.runtime.logstream import CHUNK_BYTES, log_subject
from services.runtime.output import Chunk, OutputWriter

log = structlog.get_logger("fairlane.executor.logship")
#: How often a running replica's file is looked at for new output.
POLL_S: Final = 0.5
#: After the replica ended, how long its runtime may take to write out the last output (the
#: Docker runtime copies the container's stream into the file).
SETTLE_S: Final = 0.3
_TROUBLE = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)


async def ship_replica(
    output: OutputWriter,
    path: Path,
    replica: tuple[str, str, int, int],
    launched: asyncio.Event,
    finished: asyncio.Event,
) -> None:
    """Ship one replica's output (`replica`: its node, job, attempt and index; its file at
    `path`) until it has ended and everything it wrote is published."""
    subject = log_subject(*replica)
    offset, done = 0, False
    with contextlib.suppress(*_TROUBLE):
        offset, done = await output.shipped_so_far(subject)
    if done:
        return
    await launched.wait()
    while True:
        ended = finished.is_set()
        if ended:
            await asyncio.sleep(SETTLE_S)
        try:
            offset = await _ship_new(output, subject, path, offset)
            if ended:
                await output.ship(time.time(), Chunk(subject, offset, b"", end=True))
                return
        except _TROUBLE as e:
            log.warning("log shipping delayed", subject=subject, error=str(e) or repr(e))
        await asyncio.sleep(POLL_S)


async def _ship_new(output: OutputWriter, subject: str, path: Path, offset: int) -> int:
    """Ship what the file holds beyond `offset`; returns the new offset."""
    while True:
        data = _read(path, offset)
        if not data:
            return offset
        await output.ship(time.time(), Chunk(subject, offset, data))
        offset += len(data)


def _read(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)
    except FileNotFoundError:  # not created yet (a container starting)
        return b""
