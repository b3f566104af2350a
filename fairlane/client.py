"""The command line's HTTP client for the Fairlane API: where the API is, with which token, and
errors a person understands.

Where: `--api`/`--token`, else FAIRLANE_API/FAIRLANE_TOKEN, else the config file
(FAIRLANE_CONFIG, default ~/.config/fairlane/config.yaml: `api:`, and `token:` or
`token_file:`), else the embedded cluster running from `--data-dir` and its admin token.

Every request has connect and read timeouts, so an API that is down or unreachable is an
error in seconds, never a hang; streams (logs, events) wait without a read timeout but still
connect within CONNECT_S.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from fairlane.cluster_file import read_cluster

API_ENV: Final = "FAIRLANE_API"
TOKEN_ENV: Final = "FAIRLANE_TOKEN"
CONFIG_ENV: Final = "FAIRLANE_CONFIG"
DEFAULT_CONFIG: Final = Path("~/.config/fairlane/config.yaml")
CONNECT_S: Final = 3.0
READ_S: Final = 30.0
#: The longest API answer read into memory (logs are bounded by the API as well).
MAX_ANSWER_BYTES: Final = 64 << 20


class CliError(Exception):
    """A failure to tell the user; `code` is the exit status (1 failed, 2 bad usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class ApiError(CliError):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message, 2 if status == 400 else 1)
        self.status = status
        self.field = field


@dataclass(frozen=True)
class Target:
    api: str
    token: str
    #: where the two came from, for error messages
    source: str


def resolve(api: str | None, token: str | None, data_dir: Path) -> Target:
    """Where the API is and the token to use (see the module's docstring for the order)."""
    config = _config()
    source = "--api" if api else ""
    if api is None and os.environ.get(API_ENV):
        api, source = os.environ[API_ENV], API_ENV
    if token is None and os.environ.get(TOKEN_ENV):
        token = os.environ[TOKEN_ENV]
    if api is None and config.get("api"):
        api, source = str(config["api"]), f"the config file {_config_path()}"
    if token is None:
        token = _config_token(config)
    if api is None or token is None:
        cluster = read_cluster(data_dir.resolve())
        if cluster is None or not cluster.api_url:
            if api is None:
                raise CliError(
                    f"no cluster runs from {data_dir} and no API is named: start one "
                    f"(fairlane up), or give --api URL (or {API_ENV})"
                )
        else:
            if api is None:
                api, source = cluster.api_url, f"the cluster in {data_dir}"
            if token is None and cluster.admin_token_file:
                token = _read_token(Path(cluster.admin_token_file))
    if token is None:
        raise CliError(f"no API token: give --token (or {TOKEN_ENV}, or token: in the config)")
    return Target(api.rstrip("/"), token, source)


def _config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG).expanduser()


def _config() -> dict[str, Any]:
    path = _config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise CliError(f"cannot read the config file {path}: {e.strerror}") from None
    try:
        loaded = YAML(typ="safe").load(text)
    except YAMLError as e:
        raise CliError(f"the config file {path} is not valid YAML: {e}", 2) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not set(loaded) <= {"api", "token", "token_file"}:
        raise CliError(f"the config file {path} may hold only api, token and token_file", 2)
    return loaded


def _config_token(config: dict[str, Any]) -> str | None:
    if config.get("token"):
        return str(config["token"])
    if config.get("token_file"):
        return _read_token(Path(str(config["token_file"])).expanduser())
    return None


def _read_token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise CliError(f"cannot read the token file {path}: {e.strerror}") from None


class Api:
    """A small synchronous client: one connection pool for the command's lifetime."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.http = httpx.Client(
            base_url=target.api,
            headers={"Authorization": f"Bearer {target.token}"},
            timeout=httpx.Timeout(READ_S, connect=CONNECT_S),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params=_drop_none(params))

    def get_text(self, path: str, **params: Any) -> str:
        response = self._send("GET", path, params=_drop_none(params))
        return response.text

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call("POST", path, json=body)

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A streamed answer (logs, events), chunk by chunk, waiting as long as it lasts."""
        timeout = httpx.Timeout(None, connect=CONNECT_S)
        try:
            with self.http.stream("GET", path, params=_drop_none(params), timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._error(r)
                yield from r.iter_bytes()
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    def _unreachable(self, e: httpx.HTTPError) -> CliError:
        where = f"{self.target.api} (from {self.target.source})" if self.target.source else ""
        if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
            return CliError(f"cannot reach the Fairlane API at {where}: is the cluster up?")
        if isinstance(e, httpx.TimeoutException):
            return CliError(f"the Fairlane API at {where} did not answer in time")
        return CliError(f"talking to the Fairlane API at {where} failed: {e}")

    def _error(self, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
            message, field = str(body["error"]), body.get("field")
        except (ValueError, KeyError, TypeError):  # not the Fairlane API's own answer
            message = f"{self.target.api} answered {response.status_code} "
            message += f"{response.reason_phrase}: is that a Fairlane API?"
            field = None
        if response.status_code == 401:
            message += " (check --token, FAIRLANE_TOKEN or the config file)"
        return ApiError(response.status_code, message, field)

    def job_names(self) -> list[str]:
        names: list[str] = []
        after: int | None = None
        for _ in range(20):  # at most 10,000 names: enough to suggest from
            page = self.get("/v1/jobs", limit=500, after=after)
            names += [job["job_id"] for job in page["items"]]
            after = page["next"]
            if after is None:
                break
        return names


def closest(name: str, names: list[str]) -> str:
    """' (did you mean ...?)' for the nearest of `names`, or ''."""
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def _drop_none(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}
