"""The command line's pieces that need no cluster: where the API is found, output formats,
suggestions, and how shipped log chunks become output."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from ruamel.yaml import YAML

from cluster.cluster_file import ClusterFile, cluster_file
from events.catalogue import AnyEvent
from fairlane import gpus_cli
from fairlane.client import CliError, closest, resolve
from fairlane.output import duration, size, to_yaml
from fairlane.submit_cli import _on_this_machine, _working_dir
from fairlane.timeline import details
from fairlane.top import Snapshot, _nodes
from services.api.logs import Lines


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("FAIRLANE_API", "FAIRLANE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("FAIRLANE_CONFIG", str(config))
    return config


def running_cluster(data: Path, api: str) -> None:
    data.mkdir()
    (data / "admin-token").write_text("admin-secret\n")
    info = ClusterFile(
        nats_url="nats://127.0.0.1:4222",
        postgres_uri="postgresql://127.0.0.1/postgres",
        data_dir=str(data),
        node="here",
        pids={"supervisor": os.getpid()},  # a live process: the cluster "runs"
        started_at=0.0,
        api_url=api,
        admin_token_file=str(data / "admin-token"),
    )
    cluster_file(data).write_bytes(msgspec.json.encode(info))


def test_the_embedded_cluster_is_the_default(clean_env: Path, tmp_path: Path) -> None:
    running_cluster(tmp_path / "fl", "http://127.0.0.1:8123")
    target = resolve(None, None, tmp_path / "fl")
    assert (target.api, target.token) == ("http://127.0.0.1:8123", "admin-secret")


def test_flags_then_environment_then_config_then_cluster(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running_cluster(tmp_path / "fl", "http://cluster:1")
    clean_env.write_text(f"api: http://config:2\ntoken_file: {tmp_path / 'tok'}\n")
    (tmp_path / "tok").write_text("from-config-file\n")
    assert resolve(None, None, tmp_path / "fl").api == "http://config:2"
    assert resolve(None, None, tmp_path / "fl").token == "from-config-file"
    monkeypatch.setenv("FAIRLANE_API", "http://env:3/")
    monkeypatch.setenv("FAIRLANE_TOKEN", "from-env")
    assert (resolve(None, None, tmp_path / "fl").api, resolve(None, None, tmp_path).token) == (
        "http://env:3",
        "from-env",
    )
    flagged = resolve("http://flag:4", "from-flag", tmp_path / "fl")
    assert (flagged.api, flagged.token, flagged.source) == ("http://flag:4", "from-flag", "--api")


def test_no_cluster_and_bad_config_are_explained(clean_env: Path, tmp_path: Path) -> None:
    with pytest.raises(CliError, match=r"no cluster runs from .* start one"):
        resolve(None, None, tmp_path / "none")
    with pytest.raises(CliError, match="no API token"):
        resolve("http://somewhere:1", None, tmp_path / "none")
    clean_env.write_text("api: [unclosed\n")
    with pytest.raises(CliError, match="not valid YAML") as bad:
        resolve(None, None, tmp_path)
    assert bad.value.code == 2
    clean_env.write_text("server: http://x\n")
    with pytest.raises(CliError, match="only api, token, token_file, project"):
        resolve(None, None, tmp_path)


def test_closest_names() -> None:
    names = ["large-training-job", "jupyter-workspace", "build-1"]
    assert closest("large-trainig-job", names) == " (did you mean large-training-job?)"
    assert closest("zzz", names) == ""


def test_yaml_keeps_the_api_order_and_nulls() -> None:
    data = [{"name": "a", "limit": None, "pools": [{"quota": 4}]}]
    text = to_yaml(data)
    assert text.splitlines()[0] == "- name: a"
    assert YAML(typ="safe").load(text) == data


def test_durations() -> None:
    assert [duration(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m05s", "1h01m", "1d01h"]


SUBJECT = "fairlane.logs.n1.job-1.2.{}"


def test_one_replica_is_raw_and_a_chunk_shipped_twice_is_skipped() -> None:
    lines = Lines(prefixed=False)
    r0 = SUBJECT.format(0)
    assert lines.take(r0, 0, b"step 1\nstep", end=False) == b"step 1\nstep"
    # an executor restarted mid-way ships from an earlier offset: only the new part shows
    assert lines.take(r0, 0, b"step 1\nstep 2\n", end=False) == b" 2\n"
    assert lines.take(r0, 7, b"step 2\n", end=False) == b""
    assert not lines.all_ended()
    assert lines.take(r0, 14, b"", end=True) == b""
    assert lines.all_ended()


def test_several_replicas_are_prefixed_whole_lines() -> None:
    lines = Lines(prefixed=True)
    r0, r1 = SUBJECT.format(0), SUBJECT.format(1)
    assert lines.take(r0, 0, b"a1\na", end=False) == b"[replica 0] a1\n"
    assert lines.take(r1, 0, b"b1\n", end=False) == b"[replica 1] b1\n"
    assert lines.take(r0, 4, b"2\n", end=False) == b"[replica 0] a2\n"
    assert lines.take(r1, 3, b"tail without newline", end=False) == b""
    assert lines.take(r1, 23, b"", end=True) == b"[replica 1] tail without newline\n"
    assert not lines.all_ended()  # replica 0 has not said it is done


def test_a_timeline_entry_tells_the_fields_the_log_leaves_at_their_default() -> None:
    """msgspec omits defaults on the log: a failure with the default exit code 1 has no
    `exit_code` field, and its line said "exit None" (seen on a GPU machine's timeline)."""
    base = {"id": "u/failed/1", "version": 1, "time": 1.0, "actor": "executor/vm"}
    failed = {**base, "job_id": "u", "attempt": 1, "reason": "replica 0 exited with code 1"}
    assert details({"type": "JobFailed", "event": failed}).startswith("exit code 1: replica 0")
    assert details({"type": "JobFailed", "event": {**failed, "exit_code": 3}}).startswith(
        "exit code 3:"
    )
    # an entry that does not decode as this version's event is told as it came
    assert details({"type": "JobFailed", "event": {"job_id": "u", "attempt": "?"}})
    saved = {**base, "job_id": "u", "attempt": 1, "step": 500}
    told = details({"type": "JobCheckpointed", "event": saved})
    assert told == "checkpoint of attempt 1 saved at step 500"
    # where no teller speaks (an event newer than this command line), only what the event
    # says is listed
    assert details({"type": "JobLater", "event": {**base, "attempt": 1, "step": 5}}) == (
        "attempt 1, step 5"
    )


def test_every_event_type_is_told_in_words() -> None:
    """A person reads each event as a sentence, never as a raw dict: every type in the
    catalogue has its own words (a new event type needs them too)."""
    from fairlane.timeline import _TELLERS  # noqa: PLC0415  (what the test is about)

    names = {t.__name__ for t in typing.get_args(AnyEvent)}
    assert names - set(_TELLERS) == set()
    submitted = {"spec": {"project": "p", "gpus": 2, "env": ["A=1"]}, "job_id": "j"}
    told = details({"type": "JobSubmitted", "actor": "ann", "event": submitted})
    assert told == "2 GPU(s) x 1, by ann"
    grants = {"grants": [{"prefix": "/data", "read_write": True}, {"prefix": "/ro"}]}
    told = details({"type": "VolumesConfigured", "actor": "ops", "event": grants})
    assert told == "host folders jobs may mount: /data (read-write), /ro (read-only) by ops"
    unknown = details({"type": "FromTheFuture", "event": {"terms": {"gpu": {"quota": 4}}}})
    assert unknown == "terms (gpu (quota 4))"  # nested, but in words, not {'gpu': ...}


def test_up_says_where_the_dashboard_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fairlane import cluster_cli  # noqa: PLC0415  (it imports what starts clusters)

    info = ClusterFile(
        nats_url="nats://127.0.0.1:4222", postgres_uri="postgresql://127.0.0.1/postgres",
        data_dir=str(tmp_path), node="here", pids={}, started_at=0.0,
        api_url="http://127.0.0.1:8123", admin_token_file=str(tmp_path / "admin-token"),
    )  # fmt: skip
    monkeypatch.setattr(cluster_cli, "supervisor_status", lambda _: [])
    cluster_cli._print_started(info, [], tmp_path, [])
    said = capsys.readouterr().out
    assert "Dashboard: http://127.0.0.1:8123/ui/" in said


def test_a_working_dir_that_is_not_there_is_refused_before_anything_is_sent(
    clean_env: Path, tmp_path: Path
) -> None:
    """The API named is not even listening: the error is the working directory's, so the
    submission was refused before any request."""
    missing = tmp_path / "not-there"
    argv = [str(Path(sys.executable).with_name("fairlane")), "submit", "j", "--project", "a"]
    argv += ["--api", "http://127.0.0.1:9", "--token", "t", "--working-dir", str(missing)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert f"--working-dir '{missing}': no such directory" in " ".join(run.stderr.split())


def test_the_working_dir_defaults_to_the_submitting_folder_on_this_machine(
    tmp_path: Path,
) -> None:
    assert _working_dir(None, local=True, image=None) == os.getcwd()
    assert _working_dir(None, local=True, image="trainer:1") is None  # the image's own
    assert _working_dir(None, local=False, image=None) is None
    assert _working_dir(str(tmp_path), local=True, image=None) == str(tmp_path)
    assert _working_dir("/on/the/nodes", local=False, image=None) == "/on/the/nodes"
    assert _on_this_machine("http://127.0.0.1:8080") and not _on_this_machine("https://fl.example")


def test_describe_says_how_much_checkpoint_a_stop_stored() -> None:
    event = {"job_id": "j", "attempt": 1, "reason": "priority", "checkpointed": True}
    entry = {"type": "JobPreempted", "event": {**event, "stored_bytes": 2048}}
    assert details(entry) == "stopped (priority), checkpoint saved and stored (2.0 kB)"
    assert (
        details({"type": "JobPreempted", "event": event}) == "stopped (priority), checkpoint saved"
    )


def test_describe_names_the_node_of_each_nodes_own_stop_report() -> None:
    """A gang across two nodes is stopped by both, each reporting its own replicas: the
    timeline's two lines say which node each is from."""
    event = {"job_id": "j", "attempt": 1, "reason": "reclaim", "checkpointed": True}
    for node in ("node-a", "node-b"):
        entry = {"type": "JobPreempted", "event": {**event, "node": node, "own_replicas": True}}
        assert details(entry) == f"stopped (reclaim) on {node}, checkpoint saved"
    whole = {"type": "JobPreempted", "event": {**event, "node": "node-a"}}  # the whole stop
    assert details(whole) == "stopped (reclaim), checkpoint saved"


def test_a_placement_says_each_replicas_node_and_gpus_or_that_it_has_none() -> None:
    event = {"job_id": "j", "attempt": 2, "pool": "default"}
    gang = {"type": "JobScheduled", "event": {**event, "replicas": [["a", [0, 1]], ["b", [3]]]}}
    assert details(gang) == "attempt 2 on a:0,1, b:3"
    cpu = {"type": "JobScheduled", "event": {**event, "replicas": [["vm-2", []]]}}
    assert details(cpu) == "attempt 2 on vm-2 (no GPU)"


def test_nodes_without_gpu_readings_say_why_once_not_unknown_for_every_gpu() -> None:
    def node(name: str, source: str, error: str = "") -> dict[str, typing.Any]:
        reading = 40.0 if source == "nvml" else None
        devices = [{"index": i, "utilization": reading, "memory_used_mb": None,
                    "memory_total_mb": None} for i in range(2)]  # fmt: skip
        return {"node": name, "source": source, "error": error, "devices": devices,
                "lost": False, "cordon": "", "gpus": 2, "free": 2}  # fmt: skip

    why = "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    nodes = [node("a", "unknown", why), node("b", "nvml"), node("c", "unknown", why),
             node("d", "unknown")]  # fmt: skip
    assert gpus_cli.unsampled(nodes) == {
        why: ["a", "c"],
        "no recent sample from its executor": ["d"],
    }
    console = Console(width=200, record=True)
    console.print(_nodes(Snapshot(gpus={"nodes": nodes, "jobs": []})))
    seen = console.export_text()
    assert f"no readings: {why}" in seen and "0:40% unknown  1:40% unknown" in seen
    assert "0:unknown" not in seen


def test_sizes_read_in_the_unit_that_suits_them() -> None:
    sizes = (0, 999, 1000, 10240, 3_400_000, 999_960_000, 1_200_000_000, 5 * 10**12)
    assert [size(n) for n in sizes] == [
        "0 bytes",
        "999 bytes",
        "1.0 kB",
        "10.2 kB",
        "3.4 MB",
        "1.0 GB",
        "1.2 GB",
        "5000.0 GB",
    ]
