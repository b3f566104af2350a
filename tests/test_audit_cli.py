"""`fairlane log export` and `fairlane audit` against a real nats-server: a recorded history is
put on a fresh stream, exported back line for line, and audited from the stream and the file;
and a running embedded cluster (secured NATS) audited as its admin."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import WorkRelayed
from events.catalogue import encode_event
from events.export import read_export
from services.runtime.eventlog import JetStreamLog, connect
from tests.test_embedded import port_flags

pytestmark = pytest.mark.nats
HISTORY = Path(__file__).parent / "histories" / "gang-preempted-whole.jsonl"


async def fairlane(*args: str) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fairlane.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, errors = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out, errors


async def test_export_then_audit_a_cluster_log(nats_server: NatsServer, tmp_path: Path) -> None:
    history = list(read_export(HISTORY.read_bytes().splitlines()))
    nc = await connect(nats_server.url, "test")
    try:
        stream = JetStreamLog(nc)
        await stream.ensure_stream()
        for seq, event in history:
            if isinstance(event, WorkRelayed):  # recorded when relays were in the log
                stored = await stream.publish_raw(f"fl.work.{event.node}", encode_event(event))
            else:
                stored = await stream.publish(event)
            assert stored == seq
    finally:
        await nc.close()

    code, exported, _ = await fairlane("log", "export", "--nats", nats_server.url)
    assert code == 0
    assert list(read_export(exported.splitlines())) == history

    code, out, _ = await fairlane("audit", "--nats", nats_server.url, "-o", "json")
    assert code == 0
    report = json.loads(out)
    decisions = sum(type(e).__name__ in _DECISIONS for _, e in history)
    assert report["checked"] == report["matched"] == decisions > 0

    # the nomination names a victim the policy did not choose
    tampered = exported.replace(b'"victims":["g"]', b'"victims":["a0"]', 1)
    assert tampered != exported
    (tmp_path / "tampered.jsonl").write_bytes(tampered)
    code, out, _ = await fairlane("audit", "--file", str(tmp_path / "tampered.jsonl"))
    assert code == 1
    assert b"differs from what the policy gives" in out and b"victims" in out


_DECISIONS = {"JobScheduled", "JobNominated", "JobPreemptionRequested"}


async def test_audit_names_a_bad_export_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(HISTORY.read_bytes().splitlines()[0] + b'\n{"seq": 2}\n')
    code, _, errors = await fairlane("audit", "--file", str(bad))
    assert code == 2 and b"line 2" in errors


def _cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fairlane.cli", *args, "--data-dir", str(data_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _exported_types(data_dir: Path) -> list[str]:
    exported = _cli("log", "export", data_dir=data_dir)
    assert exported.returncode == 0, exported.stderr
    return [type(e).__name__ for _, e in read_export(exported.stdout.encode().splitlines())]


@pytest.mark.slow
def test_audit_a_running_embedded_cluster_as_its_admin(tmp_path: Path) -> None:
    """`fairlane up` secures NATS: the audit reads the log with the cluster's admin credentials,
    and a reclaim that really happened there audits clean, from the stream and from a file."""
    data = tmp_path / "fl"
    up = ("up", "--detach", "--gpus", "2", "--insecure-same-user", *port_flags())
    assert _cli(*up, data_dir=data).returncode == 0
    try:
        for project in ("a", "b"):
            assert _cli("project", "set", project, "--quota", "1", data_dir=data).returncode == 0
        train = ("--gpus", "2", "--class", "train")
        ran = _cli("submit", "t", "--project", "a", *train, data_dir=data)
        assert ran.returncode == 0, ran.stderr
        deadline = time.monotonic() + 60
        while "JobStarted" not in _exported_types(data) and time.monotonic() < deadline:
            time.sleep(0.5)
        ran = _cli("submit", "w", "--project", "b", "--class", "interactive", data_dir=data)
        assert ran.returncode == 0, ran.stderr
        while _exported_types(data).count("JobScheduled") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)  # w placed once t gave its GPUs back

        audited = _cli("audit", "-o", "json", data_dir=data)
        assert audited.returncode == 0, audited.stdout + audited.stderr
        report = json.loads(audited.stdout)
        # t placed, w nominated with t as victim, t asked to stop, w placed
        assert report["checked"] == report["matched"] >= 4 and report["mismatched"] == 0
        exported = _cli("log", "export", "-O", str(tmp_path / "log.jsonl"), data_dir=data)
        assert exported.returncode == 0, exported.stderr
        from_file = _cli("audit", "--file", str(tmp_path / "log.jsonl"), data_dir=data)
        assert from_file.returncode == 0 and "every decision checked" in from_file.stdout

        # the server refuses a reader without credentials: the admin's were what let it in
        url = json.loads((data / "cluster.json").read_text())["nats_url"]
        anonymous = _cli("audit", "--nats", url, data_dir=data)
        assert anonymous.returncode == 2 and "cannot read the log" in anonymous.stderr
    finally:
        assert _cli("down", data_dir=data).returncode == 0
