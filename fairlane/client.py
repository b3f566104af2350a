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
import http.client
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cluster.cluster_file import read_cluster

API_ENV: Final = "FAIRLANE_API"
TOKEN_ENV: Final = "FAIRLANE_TOKEN"
CONFIG_ENV: Final = "FAIRLANE_CONFIG"
DEFAULT_CONFIG: Final = Path("~/.config/fairlane/config.yaml")
CONNECT_S: Final = 3.0
READ_S: Final = 30.0
#: The longest API answer read into memory (logs are bounded by the API as well).
MAX_ANSWER_BYTES: Final = 64 << 20


#: A name as the API's routes take it in their paths (jobs, projects, pools, nodes, tokens): the
#: pattern of policy/commands/names.py, written out again because importing that module pulls
#: in the event catalogue, which every command would then wait for.
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
NAME_RULE: Final = "use 1-128 letters, digits, '-' or '_', starting with a letter or digit"


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


def named(what: str, value: str) -> str:
    """`value`, checked to be a name before it becomes a segment of an API path: else a usage
    error naming `what` (the argument or flag) and the value. Unchecked, '', '/' or '?' changed
    the route asked for: `describe ''` read the job list as a job (a traceback), `logs 'j?x=1'`
    printed the job's JSON, `project set a/b` said only "Not Found"."""
    if NAME.fullmatch(value) is None:
        raise CliError(f"{what} {value!r} is not a valid name: {NAME_RULE}", 2)
    return value


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


PROJECT_ENV: Final = "FAIRLANE_PROJECT"
#: What the config file may hold.
CONFIG_KEYS: Final = ("api", "token", "token_file", "project")


def default_project() -> tuple[str, str] | None:
    """The project a command uses when given none, and where it came from: FAIRLANE_PROJECT,
    else `project:` in the config file."""
    if os.environ.get(PROJECT_ENV):
        return os.environ[PROJECT_ENV], PROJECT_ENV
    project = _config().get("project")
    return (str(project), f"the config file {config_path()}") if project else None


def project_or_fail() -> str:
    """The project a command uses when given none; a usage error (2) naming the ways to
    give one if there is none."""
    found = default_project()
    if found is None:
        raise CliError(
            f"which project? give --project NAME (or set {PROJECT_ENV}, or project: in the "
            f"config file {config_path()}: fairlane login --project NAME)",
            2,
        )
    return found[0]


def config_path() -> Path:
    return _config_path()


def write_config(values: dict[str, str | None]) -> Path:
    """Set keys of the config file (None removes one), keeping the others; the file is made
    readable by its owner only, as it may hold a token."""
    path = _config_path()
    config = {**_config(), **values}
    config = {k: v for k, v in config.items() if v is not None}
    from ruamel.yaml import YAML  # noqa: PLC0415  (slow to import: only here and in _config)

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.dump(config, out)
    os.replace(path.with_suffix(".tmp"), path)
    return path


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
    if not text.strip():
        return {}
    # imported only where there is a config file: ruamel.yaml takes a tenth of a second
    from ruamel.yaml import YAML  # noqa: PLC0415
    from ruamel.yaml.error import YAMLError  # noqa: PLC0415

    try:
        loaded = YAML(typ="safe").load(text)
    except YAMLError as e:
        raise CliError(f"the config file {path} is not valid YAML: {e}", 2) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not set(loaded) <= set(CONFIG_KEYS):
        raise CliError(f"the config file {path} may hold only {', '.join(CONFIG_KEYS)}", 2)
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
    """A small synchronous client on the standard library's http.client: one kept-alive
    connection for the command's lifetime. (Not httpx: importing it, with httpcore and what
    they pull in, took most of a command's startup.)"""

    def __init__(self, target: Target) -> None:
        self.target = target
        url = urllib.parse.urlsplit(target.api)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise CliError(f"the API URL must be http:// or https://, got {target.api!r}", 2)
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._prefix = url.path.rstrip("/")
        self._headers = {
            "Authorization": f"Bearer {target.token}",
            "Accept": "application/json",
            "User-Agent": "fairlane-cli",
        }
        self._conn: http.client.HTTPConnection | None = None
        #: "http://host:port" where requests go through an HTTP proxy (it takes whole URLs)
        self._origin = ""

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params=params)

    def get_text(self, path: str, **params: Any) -> str:
        return self._send("GET", path, params=params).decode("utf-8", errors="replace")

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call("POST", path, body=body)

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("PUT", path, body=body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("PATCH", path, body=body)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return json.loads(self._send(method, path, **kwargs) or b"null")

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """The open connection (and True: it has served a request), or a new one, connected
        within CONNECT_S, through the proxy the environment names for the API if any."""
        if self._conn is not None:
            if self._conn.sock is not None:
                return self._conn, True
            self.close()  # the server said `Connection: close` (http.client closed it)
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        proxy = _proxy_for("https" if self._https else "http", self._host)
        if proxy is None:
            conn = kind(self._host, self._port, timeout=CONNECT_S)
        elif self._https:  # a tunnel (CONNECT) through the proxy; TLS end to end
            conn = kind(proxy.hostname or "", proxy.port or 80, timeout=CONNECT_S)
            conn.set_tunnel(self._host, self._port or 443)
        else:  # requests are sent to the proxy, naming the whole URL
            conn = kind(proxy.hostname or "", proxy.port or 80, timeout=CONNECT_S)
            self._origin = f"http://{self._host}" + (f":{self._port}" if self._port else "")
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise self._unreachable(e, connecting=True) from None
        self._conn = conn
        return conn, False

    def _open(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        read_s: float | None = READ_S,
    ) -> http.client.HTTPResponse:
        """Send a request and read the answer's head. A kept-alive connection the server has
        closed meanwhile is opened again, once: the request never reached the server."""
        target = self._prefix + path
        query = _query(params or {})
        if query:
            target += "?" + query
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        while True:
            conn, reused = self._connection()
            try:
                conn.sock.settimeout(read_s)
                conn.request(method, self._origin + target, body=data, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if not reused:
                    raise self._unreachable(e) from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise self._unreachable(e) from None

    def _send(self, method: str, path: str, **kwargs: Any) -> bytes:
        response = self._open(method, path, **kwargs)
        try:
            body = response.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise self._unreachable(e) from None
        if len(body) > MAX_ANSWER_BYTES:
            self.close()
            raise CliError(f"the API's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
        if response.status >= 400:
            raise self._error(response, body)
        return body

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A streamed answer (logs, events), chunk by chunk, waiting as long as it lasts."""
        response = self._open("GET", path, params=params, read_s=None)
        try:
            if response.status >= 400:
                raise self._error(response, response.read(MAX_ANSWER_BYTES))
            while chunk := response.read1(65536):
                yield chunk
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(e) from None
        finally:
            self.close()  # a stream is read to its end or abandoned: not reused

    def _unreachable(self, e: Exception, connecting: bool = False) -> CliError:
        where = f"{self.target.api} (from {self.target.source})" if self.target.source else ""
        if type(e).__module__ == "ssl":  # a certificate or TLS failure: not a server that is down
            return CliError(f"TLS with the Fairlane API at {where} failed: {e}")
        if connecting:
            return CliError(f"cannot reach the Fairlane API at {where}: is the cluster up?")
        if isinstance(e, TimeoutError):
            return CliError(f"the Fairlane API at {where} did not answer in time")
        return CliError(f"talking to the Fairlane API at {where} failed: {e}")

    def _error(self, response: http.client.HTTPResponse, body: bytes) -> ApiError:
        try:
            answer = json.loads(body)
            message, field = str(answer["error"]), answer.get("field")
        except (ValueError, KeyError, TypeError):  # not the Fairlane API's own answer
            message = f"{self.target.api} answered {response.status} "
            message += f"{response.reason}: is that a Fairlane API?"
            field = None
        if response.status == 401:
            message += " (check --token, FAIRLANE_TOKEN or the config file)"
        return ApiError(response.status, message, field)

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


def _proxy_for(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for `scheme` (HTTPS_PROXY, HTTP_PROXY, either case),
    unless NO_PROXY covers `host`: as httpx, which the command line used before, did."""
    proxy = os.environ.get(f"{scheme}_proxy") or os.environ.get(f"{scheme.upper()}_PROXY")
    if not proxy:
        return None
    no_proxy = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    for entry in (e.strip().lower().split(":")[0] for e in no_proxy.split(",") if e.strip()):
        if entry in ("*", host) or host.endswith("." + entry.lstrip(".")):
            return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    return urllib.parse.urlsplit(proxy)


def _query(params: dict[str, Any]) -> str:
    """A query string: None left out, lists repeated, booleans as the API reads them."""
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        for one in value if isinstance(value, list | tuple) else [value]:
            if one is None:
                continue
            pairs.append((key, ("true" if one else "false") if isinstance(one, bool) else str(one)))
    return urllib.parse.urlencode(pairs)
