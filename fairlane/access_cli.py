"""Who uses the API, through the API: `login` (and `whoami`) for a person's own token, `token
create|list|revoke` for an admin handing tokens out."""

from __future__ import annotations

import getpass
import sys
import time
from typing import Annotated, Any

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane.api_options import Connection, connected
from fairlane.client import Api, Target, named, write_config
from fairlane.output import (
    USAGE,
    Output,
    ago,
    console,
    emit,
    errors_said,
    fail,
    flags_named,
    parse_duration,
)

token_app = cyclopts.App(name="token", help="API tokens (admin): create, list, revoke.")


def login(
    *,
    api: str,
    token: str | None = None,
    project: str | None = None,
    output: Output = "table",
) -> None:
    """Save where the API is and your token in the config file, once the API has accepted the
    token; later commands use them without --api and --token.

    ```
    fairlane login --api https://fairlane.example.org --project team-a
    ```

    The token is read from the terminal (not echoed) unless given with --token or on stdin.

    Parameters
    ----------
    api
        The API's URL.
    token
        Your API token (from your admin: fairlane token create).
    project
        The project your commands use when given none (submit, list).
    """
    if token is None:
        token = getpass.getpass("API token: ") if sys.stdin.isatty() else sys.stdin.readline()
    token = token.strip()
    if not token:
        fail("no token given: --token TOKEN, or type it when asked", USAGE)
    with errors_said(), Api(Target(api.rstrip("/"), token, "--api")) as client:
        me = client.get("/v1/whoami")
        path = write_config({"api": api.rstrip("/"), "token": token, "token_file": None,
                             "project": project})  # fmt: skip
        emit({**me, "api": api, "config": str(path)}, output, _logged_in)


def _logged_in(me: dict[str, Any]) -> None:
    console.print(f"logged in to {escape(me['api'])} as {escape(me['name'])}; saved in "
                  f"{escape(me['config'])} (readable by you only)")  # fmt: skip


def whoami(*, connection: Connection | None = None, output: Output = "table") -> None:
    """Who your token says you are: its name, its projects, whether it is an admin token and
    when it expires; and the API it talks to.

    ```
    fairlane whoami
    ```
    """
    with errors_said(), connected(connection) as api:
        me = {**api.get("/v1/whoami"), "api": api.target.api, "from": api.target.source}
        emit(me, output, _whoami_table)


def _until(expires_at: float | None) -> str:
    if expires_at is None:
        return "never"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(expires_at))
    left = expires_at - time.time()
    return f"{when} (in {_duration(left)})" if left > 0 else f"{when} (expired)"


def _duration(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    return f"{days}d{rest // 3600:02d}h" if days else f"{rest // 3600}h{rest % 3600 // 60:02d}m"


def _whoami_table(me: dict[str, Any]) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    projects = "every project (admin)" if me["admin"] else ", ".join(me["projects"]) or "none"
    table.add_row("Token", escape(me["name"]))
    table.add_row("Projects", escape(projects))
    table.add_row("Expires", _until(me["expires_at"]))
    table.add_row(
        "API", escape(me["api"]) + (f" (from {escape(me['from'])})" if me["from"] else "")
    )
    console.print(table)


@token_app.command(name="create")
def token_create(
    name: str,
    /,
    *,
    project: list[str] | None = None,
    admin: bool = False,
    expires: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Make a token for some projects (admin token needed); it is shown once, here.

    ```
    fairlane token create team-a-ci --project team-a --expires 30d
    ```

    Parameters
    ----------
    name
        The token's name (letters, digits, '-' and '_').
    project
        A project the token may act on and read (repeat the flag).
    admin
        An admin token: every project, and projects, pools and tokens themselves.
    expires
        How long it lasts: 90m, 12h, 30d (a minute to ten years); default: it never expires.
    """
    body: dict[str, Any] = {"name": name, "projects": project or [], "admin": admin}
    if expires is not None:
        with errors_said():
            body["expires_in_s"] = parse_duration(expires, "--expires")
    if not admin and not project:
        fail("a token needs --project NAME (repeat for several), or --admin", USAGE)
    sent = {**body, "expires_in_s": expires}  # (errors show the value as given)
    flags = {"name": "NAME", "projects": "--project", "expires_in_s": "--expires"}
    with errors_said(), connected(connection) as api, flags_named(sent, flags):
        made = api.post("/v1/tokens", body)
        emit(made, output, _created)


def _created(made: dict[str, Any]) -> None:
    console.print(f"token {escape(made['name'])} made; expires {_until(made['expires_at'])}. "
                  "It is shown only now:")  # fmt: skip
    console.print(made["token"], soft_wrap=True)


@token_app.command(name="list")
def token_list(*, connection: Connection | None = None, output: Output = "table") -> None:
    """Every token: name, projects, admin or not, when made and when it expires (admin token
    needed); never the tokens themselves.

    ```
    fairlane token list
    ```
    """
    with errors_said(), connected(connection) as api:
        emit(api.get("/v1/tokens"), output, _tokens_table)


def _tokens_table(found: list[dict[str, Any]]) -> None:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "PROJECTS", "ADMIN", "MADE", "EXPIRES"):
        table.add_column(column)
    for t in found:
        table.add_row(
            escape(t["name"]),
            escape(", ".join(t["projects"]) or "-"),
            "yes" if t["admin"] else "no",
            ago(t.get("created_at")),
            _until(t.get("expires_at")),
        )
    console.print(table)


@token_app.command(name="revoke")
def token_revoke(
    names: Annotated[list[str], cyclopts.Parameter(name="NAME")],
    /,
    *,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Revoke tokens (admin token needed): they are refused from now on.

    ```
    fairlane token revoke team-a-ci
    ```

    Parameters
    ----------
    names
        The tokens' names.
    """
    revoked: list[dict[str, Any]] = []
    with errors_said():
        for name in names:  # all checked before the first is revoked
            named("NAME", name)
    with errors_said(), connected(connection) as api:
        for name in names:
            with flags_named({"name": name}, {"name": "NAME"}):
                revoked.append(api.delete(f"/v1/tokens/{name}"))
        emit(revoked, output, _revoked)


def _revoked(gone: list[dict[str, Any]]) -> None:
    for token in gone:
        console.print(f"token {escape(token['name'])} revoked")
