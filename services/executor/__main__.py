"""`python -m services.executor`: run the node executor for this machine.

    python -m services.executor --nats URL --node NAME --pool POOL [--gpus N]
        [--data-dir DIR] [--runtime process|docker [--docker-host URL]]
        [--hollow [--hollow-runtime SECONDS]] [--stop-workloads-on-exit | --shutdown-on-exit]
        [--gpu-sample SECONDS] [--idle-after DURATION]

SIGTERM or SIGINT stops the executor cleanly. Its workloads keep running (they are in sessions
of their own) and the next executor on this node adopts them, unless
`--stop-workloads-on-exit` (for tests) stops them too, or `--shutdown-on-exit` (a cluster shut
down, as `fairlane down` does it) stops them as a preemption does and reports them stopped
(`JobPreempted(reason="shutdown")`), so their jobs are queued again and resume.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import structlog

from events.catalogue import LOCAL_ADDRESS
from services.executor.gpus import GpuDiscoveryError, discover_gpus
from services.executor.service import Executor, ExecutorConfig
from services.executor.storage import DEFAULT_MAX_BYTES, parse_storage
from services.runtime.auth import executor_consumer
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.gpu_samples import (
    DEFAULT_EVERY_S,
    DEFAULT_IDLE_AFTER_S,
    MAX_EVERY_S,
    MIN_EVERY_S,
)

log = structlog.get_logger("fairlane.executor")
#: The GPU sampling flags' defaults may come from the environment, so a whole cluster started
#: by `fairlane up` (which passes no such flags) can be told them.
SAMPLE_ENV = "FAIRLANE_GPU_SAMPLE"
IDLE_ENV = "FAIRLANE_IDLE_AFTER"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m` or `2h`."""
    text = text.strip()
    scale = _UNITS.get(text[-1:])
    number = text[:-1] if scale is not None else text
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration (90, 90s, 15m, 2h)") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration is 0 or more")
    return seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.executor", description="Fairlane node executor"
    )
    _node_options(parser.add_argument_group("the node"))
    _storage_options(parser.add_argument_group("checkpoints"))
    _runtime_options(parser.add_argument_group("how replicas run"))
    _timing_options(parser.add_argument_group("how often"))
    _exit_options(parser.add_argument_group("on exit"))
    _log_options(parser.add_argument_group("logs"))
    args = parser.parse_args(argv)
    _check(parser, args)
    return args


#: What `add_argument_group` gives (argparse names no public type for it).
Group = argparse._ArgumentGroup


def _node_options(group: Group) -> None:
    group.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    group.add_argument("--node", default=socket.gethostname(), help="node name (the hostname)")
    group.add_argument("--pool", default="default", help="pool the node belongs to")
    group.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs this node offers; overrides NVML (needed where there is no NVIDIA driver)",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="checkpoints, logs and process records (default .fairlane/executor/NODE)",
    )
    group.add_argument(
        "--address",
        default=LOCAL_ADDRESS,
        help="where other nodes reach this node's replicas: a gang's MASTER_ADDR when its "
        f"replica 0 runs here (default {LOCAL_ADDRESS}: every node on this machine)",
    )


def _storage_options(group: Group) -> None:
    group.add_argument(
        "--checkpoint-storage",
        default="object_store",
        metavar="object_store|shared_fs:PATH",
        help="where the jobs' checkpoints are kept: the cluster's object store (default), or "
        "a folder mounted at the same path on every node",
    )
    group.add_argument(
        "--checkpoint-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help="the largest checkpoint of one replica that is stored in the object store",
    )


def _runtime_options(group: Group) -> None:
    group.add_argument(
        "--hollow", action="store_true", help="start nothing: replicas run only in memory"
    )
    group.add_argument(
        "--runtime",
        choices=("process", "docker"),
        default="process",
        help="run replicas as local processes or as Docker containers of the job's image",
    )
    group.add_argument(
        "--docker-host", default=None, help="Docker engine address (default: DOCKER_HOST)"
    )
    group.add_argument(
        "--docker-network", default="host", help="network mode of the containers (host)"
    )
    group.add_argument(
        "--hollow-runtime",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="hollow replicas complete after this long (default 0: never)",
    )
    group.add_argument(
        "--insecure-same-user",
        action="store_true",
        help="run workloads as the executor's own user, which lets every job read what the "
        "executor reads (credentials, tokens, other jobs' files): only where every job is "
        "the operator's own; by default each job runs as a uid of its own, which needs root",
    )


def _timing_options(group: Group) -> None:
    group.add_argument(
        "--checkpoint-poll",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often to look for a touched .checkpoint",
    )
    group.add_argument(
        "--heartbeat",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often to put the node's heartbeat in the heartbeat bucket",
    )
    group.add_argument(
        "--gpu-sample",
        type=float,
        default=float(os.environ.get(SAMPLE_ENV, DEFAULT_EVERY_S)),
        metavar="SECONDS",
        help=f"seconds between two samples of the GPUs through NVML, {MIN_EVERY_S:g} to "
        f"{MAX_EVERY_S:g}, or 0 for none (default {DEFAULT_EVERY_S:g}, or ${SAMPLE_ENV})",
    )
    group.add_argument(
        "--idle-after",
        type=duration,
        default=duration(os.environ.get(IDLE_ENV, str(DEFAULT_IDLE_AFTER_S))),
        metavar="DURATION",
        help="flag a job idle once all its GPUs were at 0%% this long "
        f"(default 15m, or ${IDLE_ENV})",
    )


def _exit_options(group: Group) -> None:
    group.add_argument(
        "--stop-workloads-on-exit",
        action="store_true",
        help="stop the workloads when the executor exits (default: leave them to be adopted)",
    )
    group.add_argument(
        "--shutdown-on-exit",
        action="store_true",
        help="on exit, stop the workloads as a preemption does (SIGTERM, grace, checkpoint) "
        "and report them stopped for a shut down: their jobs are queued again",
    )


def _log_options(group: Group) -> None:
    group.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="as the other services"
    )
    group.add_argument("--log-level", default="info")


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check itself, refused naming the flag and the value."""
    try:
        args.storage = parse_storage(args.checkpoint_storage, args.checkpoint_max_bytes)
    except ValueError as e:
        parser.error(str(e))
    if args.gpu_sample != 0 and not MIN_EVERY_S <= args.gpu_sample <= MAX_EVERY_S:
        parser.error(
            f"--gpu-sample must be 0 or {MIN_EVERY_S:g} to {MAX_EVERY_S:g} seconds, "
            f"got {args.gpu_sample:g}"
        )
    if args.checkpoint_max_bytes <= 0:
        parser.error(f"--checkpoint-max-bytes must be above 0, got {args.checkpoint_max_bytes}")


def configure_logging(fmt: str, level: str) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def stopping(executor: Executor) -> None:
    log.info("executor stopping", node=executor.node)
    executor.stop()


async def serve(args: argparse.Namespace) -> int:
    try:
        inventory = discover_gpus(args.gpus)
    except GpuDiscoveryError as e:
        log.error("cannot tell how many GPUs this node has", error=str(e))
        return 2
    config = ExecutorConfig(
        node=args.node,
        pool=args.pool,
        gpus=inventory.count,
        gpu_uuids=inventory.uuids,
        gpu_devices=inventory.devices,
        gpu_source=inventory.source,
        data_dir=args.data_dir or Path(".fairlane/executor") / args.node,
        address=args.address,
        hollow=args.hollow,
        runtime=args.runtime,
        docker_host=args.docker_host,
        docker_network=args.docker_network,
        hollow_runtime_s=args.hollow_runtime,
        checkpoint_poll_s=args.checkpoint_poll,
        checkpoint_storage=args.storage,
        heartbeat_s=args.heartbeat,
        stop_workloads_on_exit=args.stop_workloads_on_exit,
        gpu_sample_s=args.gpu_sample or None,
        idle_after_s=args.idle_after,
        shutdown_on_exit=args.shutdown_on_exit,
        same_user=args.insecure_same_user,
    )
    nc = await connect(args.nats, name=f"executor-{args.node}")
    # one executor per node: its durable consumer is named after the node (and its NATS user
    # may read through that consumer only, its node's work only)
    executor = Executor(JetStreamLog(nc, durable=executor_consumer(args.node)), config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, executor)
    code = 0
    try:
        await executor.run()
    except Exception:
        log.exception("executor failed", node=args.node)
        code = 1
    with contextlib.suppress(Exception):
        await nc.close()
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
