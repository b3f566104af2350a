"""`python -m services.api --nats URL --postgres DSN [--host H --port P] [--admin-token-file F]
[--node-runtime process|docker]`."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import uvicorn

from services.api.app import Settings, create_app
from services.runtime.main import configure_logging
from services.runtime.postgres import DSN_ENV


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.api")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL DSN (default: {DSN_ENV}, which keeps a password out of the process list)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--admin-token-file", type=Path, help="made (mode 0600) with a new admin token if absent"
    )
    parser.add_argument(
        "--node-runtime",
        choices=["process", "docker"],
        help="how every node's executor runs workloads, if known: process refuses images",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    if not args.postgres:
        parser.error(f"--postgres or {DSN_ENV} is required")
    configure_logging(args.log_level)
    settings = Settings(
        args.nats, args.postgres, args.admin_token_file, node_runtime=args.node_runtime
    )
    app = create_app(settings)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
