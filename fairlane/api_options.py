"""The options every API command takes: where the API is and which token to use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import cyclopts

from cluster.cluster_file import DEFAULT_DATA_DIR
from fairlane.client import Api, resolve


@cyclopts.Parameter(name="*", group="Connection")
@dataclass(frozen=True)
class Connection:
    api: Annotated[str | None, cyclopts.Parameter(help="API URL (or FAIRLANE_API)")] = None
    token: Annotated[str | None, cyclopts.Parameter(help="API token (or FAIRLANE_TOKEN)")] = None
    data_dir: Annotated[
        Path,
        cyclopts.Parameter(help="the embedded cluster used when no API is named"),
    ] = DEFAULT_DATA_DIR


@contextmanager
def connected(connection: Connection | None) -> Iterator[Api]:
    c = connection or Connection()
    api = Api(resolve(c.api, c.token, c.data_dir))
    try:
        yield api
    finally:
        api.close()
