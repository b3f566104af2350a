"""A stand-in for the HTTP API, for the command line's tests that need no cluster: it answers
each (method, path) with a canned status and JSON body and records every request, so a test
sees both what the command sent and what a person is shown."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: (status, JSON body, or bytes sent as they are), or a function of the request giving one
Answer = tuple[int, Any]
Route = Answer | Callable[["Request"], Answer]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class FakeApi:
    url: str = ""
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def on(self, method: str, path: str, answer: Route) -> None:
        self.routes[(method, path)] = answer

    def sent(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]


def _handler(api: FakeApi) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the API serves

        def _answer(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(
                self.command, url.path, urllib.parse.parse_qs(url.query),
                json.loads(raw) if raw else None,
            )  # fmt: skip
            api.requests.append(request)
            route = api.routes.get((self.command, url.path))
            if route is None:
                status, body = 404, {"error": f"no route {url.path}", "status": 404}
            else:
                status, body = route(request) if callable(route) else route
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


def fairlane(
    api: FakeApi | None, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`fairlane ARGS` in a fresh interpreter, talking to `api` (its URL and a token given by
    the environment), with no config file unless `env` names one."""
    environment = {**os.environ, "COLUMNS": "160", "FAIRLANE_CONFIG": os.devnull}
    for name in ("FAIRLANE_API", "FAIRLANE_TOKEN", "FAIRLANE_PROJECT"):
        environment.pop(name, None)
    if api is not None:
        environment |= {"FAIRLANE_API": api.url, "FAIRLANE_TOKEN": "test-token"}
    environment |= env or {}
    return subprocess.run(
        [sys.executable, "-m", "fairlane.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, env=environment, check=False,
    )  # fmt: skip
