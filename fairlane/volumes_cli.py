"""Volumes, through the HTTP API: the host folders an admin lets jobs mount (allow, deny,
list), and `submit --volume HOST:CONTAINER[:ro|rw]` read into what the API takes."""

from __future__ import annotations

import urllib.parse
from typing import Any, Final

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane.api_options import Connection, connected
from fairlane.output import USAGE, Output, console, emit, errors_said, fail, flags_named

MODES: Final = {"ro": True, "rw": False}  # the mode -> read_only
#: The argument an API error about the prefix is about (the deny route's query is `prefix`).
_NAMED: Final = {"host_prefix": "HOST_PREFIX", "prefix": "HOST_PREFIX"}
SHAPE: Final = "HOST:CONTAINER[:ro|rw] (or HOST for the same path, read-only)"


def parse_volume(value: str, flag: str = "--volume") -> dict[str, Any]:
    """`HOST`, `HOST:CONTAINER` or `HOST:CONTAINER:ro|rw` as the API's volume (read-only
    unless `:rw`); whether the paths are allowed is admission's to say."""
    parts = value.split(":")
    if len(parts) > len(MODES) + 1 or not all(parts[:2]):
        fail(f"{flag} takes {SHAPE}, got {value!r}", USAGE)
    host = parts[0]
    container = parts[1] if len(parts) > 1 else host
    mode = parts[2] if len(parts) > 2 else "ro"
    if mode not in MODES:
        fail(f"{flag} {value!r}: the mode is ro or rw, got {mode!r}", USAGE)
    return {"host": host, "container": container, "read_only": MODES[mode]}


def volumes_allow(
    host_prefix: str,
    /,
    *,
    read_write: bool = False,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Let jobs mount a host folder and everything under it (admin token). Allowing a folder
    again changes its mode. Every node's folder of that path is reachable: see the operations
    guide for what that gives a tenant.

    ```
    fairlane volumes allow /datasets
    fairlane volumes allow /scratch --read-write
    ```

    Parameters
    ----------
    host_prefix
        An absolute path on the nodes.
    read_write
        Jobs may mount it writable (`:rw`); default: read-only.
    """
    body = {"host_prefix": host_prefix, "read_write": read_write}
    with errors_said(), connected(connection) as api, flags_named(body, _NAMED):
        emit(api.post("/v1/volumes", body), output, _grants_after)


def volumes_deny(
    host_prefix: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Take a host folder off the allowlist (admin token); jobs admitted before keep theirs.

    ```
    fairlane volumes deny /scratch
    ```
    """
    query = urllib.parse.urlencode({"prefix": host_prefix})
    sent = {"prefix": host_prefix, "host_prefix": host_prefix}
    with errors_said(), connected(connection) as api, flags_named(sent, _NAMED):
        emit(api.delete(f"/v1/volumes?{query}"), output, _grants_after)


def volumes_list(*, connection: Connection | None = None, output: Output = "table") -> None:
    """The host folders jobs may mount, each read-only or read-write.

    ```
    fairlane volumes list
    ```
    """
    with errors_said(), connected(connection) as api:
        emit(api.get("/v1/volumes"), output, grants_table)


def grants_table(grants: list[dict[str, Any]]) -> None:
    if not grants:
        console.print("no host folders may be mounted (fairlane volumes allow PATH)")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("HOST PREFIX")
    table.add_column("MODE")
    for g in grants:
        table.add_row(escape(g["prefix"]), "read-write" if g["read_write"] else "read-only")
    console.print(table)


def _grants_after(answer: dict[str, Any]) -> None:
    grants = answer.get("event", {}).get("grants", [])
    grants_table(
        [{"prefix": g["prefix"], "read_write": g.get("read_write", False)} for g in grants]
    )


volumes_app = cyclopts.App(name="volumes", help="Host folders jobs may mount: allow, deny, list.")
volumes_app.command(volumes_allow, name="allow")
volumes_app.command(volumes_deny, name="deny")
volumes_app.command(volumes_list, name="list")
