"""`fairlane log export` and `fairlane audit` against a real nats-server: a recorded history is
put on a fresh stream, exported back line for line, and audited from the stream and the file."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from events.export import read_export
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.servers import NatsServer

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
            assert await stream.publish(event) == seq
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
