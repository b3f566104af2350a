"""The shell every service process shares: flags, logging, connecting, clean shutdown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from services.runtime.auth import INSTANCES, service_consumer
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait

Body = Callable[[JetStreamLog], Coroutine[Any, Any, None]]
#: A folder to write each service's cProfile to, `<folder>/<service>.prof`, when it stops
#: (benchmarks: `bench.pipeline --profile`); unset, nothing is profiled.
PROFILE_ENV = "FAIRLANE_PROFILE_DIR"


def configure_logging(level: str = "info") -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            # `log.exception` (or exc_info=True) writes the traceback: without this the
            # renderer dropped it, and an error log said what failed but never where
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def run_service(name: str, body: Body) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--instance",
        type=instance_number,
        default=0,
        help=f"this instance's number, 0 to {INSTANCES - 1}: the same across its restarts, so "
        "that its durable consumer is reused, and another for each instance of the service "
        "in the cluster (a standby beside the leader)",
    )
    args = parser.parse_args()
    configure_logging(args.log_level)
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        asyncio.run(_main(name, args.nats, body, args.instance))
        return
    profiler = cProfile.Profile()
    try:
        profiler.runcall(asyncio.run, _main(name, args.nats, body, args.instance))
    finally:
        profiler.dump_stats(os.path.join(folder, f"{name}.prof"))


def instance_number(text: str) -> int:
    """`--instance`'s value, or argparse's clear error naming the flag and the value."""
    if not (text.isascii() and text.isdigit() and int(text) < INSTANCES):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of 0..{INSTANCES - 1}")
    return int(text)


async def _main(name: str, url: str, body: Body, instance: int) -> None:
    # the live tail through a durable consumer of this instance's own (a standby beside a
    # leader is another instance, so another consumer); a restarted instance takes its own
    # consumer back (it is made again from where the service's replay ended). Its name is
    # one of those fixed in advance, which every other service is refused (auth.py).
    durable = service_consumer(name, instance)
    log = JetStreamLog(await connect(url, name), durable=durable)
    task = asyncio.create_task(body(log))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    await cancel_and_wait(task)
    stopping.cancel()
    with contextlib.suppress(Exception):
        await log.nc.drain()
    error = None if task.cancelled() else task.exception()
    if error is not None:  # the service died by itself: let the process say so
        raise error
