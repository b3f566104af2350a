"""A tenant's job trying, from inside its workload, each way into the cluster that a security
review found open (tests/test_tenant.py runs it). Standard library only: the interpreter is
whatever the node has. It prints one JSON line: per attempt, what it got."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def outcome(action: Callable[[], object]) -> str:
    try:
        return f"GOT {action()!r:.60}"
    except OSError as e:
        return type(e).__name__


def api(method: str, url: str, token: str, body: dict[str, object] | None = None) -> str:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return f"GOT {answer.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"


def nats_publish(host: str, port: int, user: str, password: str) -> str:
    """Raw NATS: CONNECT as `user` (empty: anonymously), publish a JobCompleted of the victim."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.recv(4096)  # INFO
        auth = {"user": user, "pass": password} if user else {}
        connect = {"verbose": False, "pedantic": False, **auth}
        event = b'{"type":"JobCompleted","job_id":"victim","attempt":1}'
        s.sendall(
            f"CONNECT {json.dumps(connect)}\r\n".encode()
            + f"PUB fl.jobs.victim {len(event)}\r\n".encode()
            + event
            + b"\r\nPING\r\n"
        )
        answer = b""
        while b"PONG" not in answer and b"-ERR" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer.decode(errors="replace").strip()[:80]


def postgres_startup(path: str) -> str:
    """The server's first answer to a startup message as user postgres (R 0: no password)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        params = b"user\0postgres\0database\0postgres\0\0"
        s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        kind, _, code = struct.unpack("!cii", s.recv(9))
        return "trusted" if (kind, code) == (b"R", 0) else f"{kind.decode()} {code}"


def own_endpoint() -> str:
    """Its own attempt's events endpoint still answers it: an empty body with its own token
    is refused as a body (400), after the token was taken (401 otherwise)."""
    token = os.environ["FAIRLANE_EVENTS_TOKEN"]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(os.environ["FAIRLANE_EVENTS"])
        s.sendall(
            b"POST /v1/events HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        return s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]


def main() -> None:
    data, api_url, nats_port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    executor = data / "executor"
    got: dict[str, object] = {"uid": os.getuid()}
    # 1. the admin token and the NATS credentials
    got["admin_token"] = outcome((data / "admin-token").read_text)
    got["credentials_listed"] = outcome(lambda: os.listdir(data / "credentials"))
    got["admin_credentials"] = outcome((data / "credentials/admin.json").read_text)
    got["data_listed"] = outcome(lambda: os.listdir(data))
    got["cluster_file"] = outcome((data / "cluster.json").read_text)
    # 2. cancel the victim and raise its own quota, with whatever token it could read
    try:
        token = (data / "admin-token").read_text().strip()
    except OSError:
        token = ""
    got["api_cancel"] = api("DELETE", f"{api_url}/v1/jobs/victim", token)
    got["api_quota"] = api("PUT", f"{api_url}/v1/projects/tenant", token, {"quota": 8})
    # 3. complete the victim over raw NATS as the executor
    user, password = "", ""
    try:
        found = [p for p in os.listdir(data / "credentials") if p.startswith("executor-")]
        creds = json.loads((data / "credentials" / found[0]).read_text())
        user, password = creds["user"], creds["password"]
        got["executor_credentials"] = "GOT"
    except (OSError, IndexError) as e:
        got["executor_credentials"] = type(e).__name__
    got["nats_as_executor"] = nats_publish("127.0.0.1", nats_port, user, password)
    # 4. PostgreSQL's socket (its password file too)
    got["postgres_password"] = outcome((data / "postgres.password").read_text)
    got["postgres_socket"] = outcome(lambda: postgres_startup(str(data / "postgres/.s.PGSQL.5432")))
    # 5. another tenant's output and checkpoint
    victim_log = executor / "runs/victim/1.0.log"
    victim_state = executor / "checkpoints/victim/replica-0/state"
    got["victim_output"] = outcome(victim_log.read_text)
    got["victim_checkpoint_read"] = outcome(victim_state.read_text)
    got["victim_checkpoint_write"] = outcome(lambda: victim_state.write_text("overwritten"))
    got["victim_home"] = outcome(lambda: os.listdir(executor / "runs/victim/home"))
    # 6. the victim's events token, from /proc or the executor's records
    environs = {"readable": 0, "refused": 0}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except PermissionError:
            environs["refused"] += 1
            continue
        except OSError:
            continue
        if b"FAIRLANE_JOB_ID=victim\0" in environ and b"FAIRLANE_EVENTS_TOKEN=" in environ:
            environs["readable"] += 1
    got["victim_environ"] = environs
    got["records"] = outcome((executor / "processes.json").read_text)
    # its own folders stay its own to use
    got["own_checkpoint"] = outcome(
        lambda: Path(os.environ["FAIRLANE_CHECKPOINT_DIR"], "mine").write_text("ok")
    )
    got["own_home"] = outcome(lambda: Path(os.environ["HOME"], "mine").write_text("ok"))
    got["own_endpoint"] = outcome(own_endpoint)
    print("RESULTS " + json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
