"""`python -m services.projector --nats URL --postgres DSN`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

from services.projector.service import DEFAULT_NAME, Projector
from services.runtime.auth import projector_consumer
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.main import configure_logging
from services.runtime.postgres import DSN_ENV
from services.runtime.tasks import cancel_and_wait


async def main(nats_url: str, dsn: str, name: str) -> None:
    # named by its read models, not its process: a restarted projector takes its consumer
    # back instead of leaving one behind per process (each kept for an hour by the server),
    # and no other service's user may touch it (services/runtime/auth.py denies it by name)
    durable = projector_consumer(name)
    nc = await connect(nats_url, "projector")
    log = JetStreamLog(nc, durable=durable)
    task = asyncio.create_task(Projector(log, dsn, name=name).run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    await cancel_and_wait(task)
    stopping.cancel()
    with contextlib.suppress(Exception):  # stopped for good (or for a while): nobody reads it
        await log.drop_durable()
    with contextlib.suppress(Exception):
        await nc.drain()
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m services.projector")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL DSN (default: {DSN_ENV}, which keeps a password out of the process list)",
    )
    parser.add_argument("--name", default=DEFAULT_NAME, help="the read models' position name")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    if not args.postgres:
        parser.error(f"--postgres or {DSN_ENV} is required")
    configure_logging(args.log_level)
    asyncio.run(main(args.nats, args.postgres, args.name))
