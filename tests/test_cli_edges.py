"""The command line's edges, as a new user meets them, against a stand-in for the API (see
tests/fake_api.py): how fast a command starts, what it sends, and what a person is shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fake_api import FakeApi, Request, fairlane, fake_api


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fake_api() as running:
        running.on("GET", "/v1/jobs", (200, {"items": [], "next": None}))
        yield running


#: Runs the command line as `python -m fairlane.cli` does, and prints the modules it imported.
_RUN_AND_TELL = """
import atexit, json, runpy, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["fairlane", *sys.argv[1:]]
runpy.run_module("fairlane.cli", run_name="__main__")
"""


def imported(api: FakeApi, *args: str) -> set[str]:
    """The modules `fairlane ARGS` imports."""
    env = {**os.environ, "FAIRLANE_API": api.url, "FAIRLANE_TOKEN": "t", "COLUMNS": "160",
           "FAIRLANE_CONFIG": os.devnull}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _RUN_AND_TELL, *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("MODULES ")]
    return set(json.loads(line.removeprefix("MODULES ")))


def test_list_imports_only_the_http_client_and_its_own_module(api: FakeApi) -> None:
    modules = imported(api, "list")
    assert "fairlane.jobs_cli" in modules
    # neither httpx (with httpcore, and trio where installed) nor the YAML parser, the event
    # catalogue or another command's module: they made every command take a second or more
    slow = {"httpx", "httpcore", "ruamel.yaml", "events.catalogue", "fairlane.cluster_view_cli",
            "fairlane.top"}  # fmt: skip
    assert modules.isdisjoint(slow), modules & slow
    assert "fairlane.jobs_cli" not in imported(api, "--help")
    assert "no jobs" in fairlane(api, "list").stdout


def test_help_of_a_lazily_imported_command_is_its_own(api: FakeApi) -> None:
    shown = fairlane(api, "list", "--help").stdout
    assert "--all-projects" in shown and "--state" in shown
    assert "fairlane list --project team-a --state running" in shown  # its docstring's example
    listing = fairlane(api, "--help").stdout
    assert "Jobs, in submission order." in listing  # the one-line summary
    from fairlane.cli import EVERYDAY  # noqa: PLC0415  (what the test is about)

    for path, name, _ in EVERYDAY:  # every import path names a command that exists
        module, _, attribute = path.partition(":")
        assert hasattr(__import__(module, fromlist=[attribute]), attribute), name


def test_the_client_sends_filters_and_says_what_went_wrong(api: FakeApi) -> None:
    listed = fairlane(api, "list", "--state", "running", "--project", "team-a", "-o", "json")
    assert json.loads(listed.stdout) == []
    (sent,) = api.sent("GET", "/v1/jobs")
    assert sent.query == {"state": ["running"], "project": ["team-a"], "limit": ["500"]}
    api.on("GET", "/v1/jobs", (401, {"error": "unknown API token", "status": 401}))
    refused = fairlane(api, "list")
    assert refused.returncode == 1 and "unknown API token (check --token" in refused.stderr
    away = fairlane(None, "list", "--api", "http://127.0.0.1:9", "--token", "t")
    assert away.returncode == 1
    assert "cannot reach the Fairlane API at http://127.0.0.1:9" in away.stderr
    tls = fairlane(None, "list", "--api", api.url.replace("http:", "https:"), "--token", "t")
    assert tls.returncode == 1 and "TLS with the Fairlane API at https://" in tls.stderr


def test_bench_cli_startup_runs(tmp_path: Path) -> None:
    """The benchmark runs (one round, against this very commit); its figures are printed."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.cli_startup", "--baseline", "HEAD", "--runs", "1",
         "-o", "json"],
        capture_output=True, text=True, timeout=300, check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)["figures"]
    assert set(figures) == {"list", "list --help"}
    assert all(f["before_s"] > 0 and f["after_s"] > 0 for f in figures.values())


@pytest.mark.parametrize("gpus", ["0.5", "1.9", "-1"])
def test_fractional_or_negative_gpus_are_refused_not_rounded(api: FakeApi, gpus: str) -> None:
    done = fairlane(api, "submit", "j", "--project", "p", f"--gpus={gpus}")
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.replace("│", " ").split())  # (cyclopts draws a box)
    assert f"--gpus: '{gpus}'" in said
    if gpus != "-1":
        assert "fractional GPUs are not supported yet" in said
    assert api.sent("POST", "/v1/jobs") == []  # refused here, never sent


def test_lengths_of_time_are_seconds_or_written_out_and_a_bad_one_names_its_flag(
    api: FakeApi, tmp_path: Path
) -> None:
    bad = (["--grace", "nan"], ["--preemption-delay", "inf"], ["--min-runtime", "1e400"],
           ["--preemption-delay", "5x"], ["--min-runtime", "-3"])  # fmt: skip
    for args in bad:
        done = fairlane(api, "submit", "j", "--project", "p", *args)
        assert done.returncode == 2, done.stderr
        said = " ".join(done.stderr.replace("│", " ").split())  # (cyclopts draws a box)
        assert f"{args[0]}: '{args[1]}' is not a duration (write it like 45, 90s" in said
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nproject: p\ngrace: .nan\n")
    from_file = fairlane(api, "submit", "-f", str(spec))
    assert from_file.returncode == 2
    assert "grace takes a length of time: nan is not a duration" in from_file.stderr
    assert api.sent("POST", "/v1/jobs") == []  # refused here, never sent
    api.on("POST", "/v1/jobs", (201, {"event": "JobAdmitted", "job_id": "j"}))
    spec.write_text("name: j\nproject: p\nmin-runtime: 1h30m\ngrace: 45\n")
    written = ("--preemption-delay", "5m", "--grace", "90s")
    assert fairlane(api, "submit", "-f", str(spec), *written).returncode == 0
    body = api.sent("POST", "/v1/jobs")[0].body
    assert (body["preemption_delay_s"], body["min_runtime_s"], body["grace_s"]) == (
        300.0,
        5400.0,
        90.0,
    )


def test_more_min_replicas_than_replicas_is_a_usage_error(api: FakeApi, tmp_path: Path) -> None:
    done = fairlane(api, "submit", "j", "--project", "p", "--replicas", "2", "--min-replicas", "3")
    assert done.returncode == 2, done.stderr
    assert "error: --min-replicas 3: must be from 1 to --replicas (2)" in done.stderr
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nproject: p\nmin-replicas: 2\n")  # replicas: 1 by default
    from_file = fairlane(api, "submit", "-f", str(spec))
    assert from_file.returncode == 2 and "--min-replicas 2: must be from 1 to" in from_file.stderr
    assert api.sent("POST", "/v1/jobs") == []  # refused here, never sent
    api.on("POST", "/v1/jobs", (201, {"event": "JobAdmitted", "job_id": "j"}))
    elastic = fairlane(api, "submit", "j", "--project", "p", "--replicas", "4", "--min-replicas=2")
    assert elastic.returncode == 0, elastic.stderr
    assert api.sent("POST", "/v1/jobs")[0].body["min_replicas"] == 2


def test_every_integer_flag_refuses_a_fraction(api: FakeApi) -> None:
    for args in (
        ["submit", "j", "--project", "p", "--replicas", "1.5"],
        ["project", "set", "p", "--quota", "2.5"],
        ["list", "--limit", "9.9"],
    ):
        done = fairlane(api, *args)
        said = " ".join(done.stderr.replace("│", " ").split())
        assert done.returncode == 2 and "is not a whole number" in said, (args, said)
        assert f"'{args[-1]}'" in said and args[-2] in said
    assert [r.method for r in api.requests] == []


def test_api_errors_name_the_flag_and_the_value(api: FakeApi) -> None:
    api.on("POST", "/v1/jobs", (422, {"error": "unknown pool 'gpu'", "field": "pools"}))
    pool = fairlane(api, "submit", "j", "--project", "p", "--pool", "gpu")
    assert pool.returncode == 1 and "error: --pool gpu: unknown pool 'gpu'" in pool.stderr
    api.on("POST", "/v1/jobs", (400, {"error": "grace_s: Expected `float` <= 3600.0 (in body)",
                                       "field": "grace_s"}))  # fmt: skip
    grace = fairlane(api, "submit", "j", "--project", "p", "--grace", "7200")
    assert grace.returncode == 2 and "error: --grace 7200.0: grace_s: Expected" in grace.stderr
    refusal = "this cluster's nodes run workloads as processes, not containers"
    api.on("POST", "/v1/jobs", (422, {"error": refusal, "field": "image"}))
    image = fairlane(api, "submit", "j", "--project", "p", "--image", "alpine:3", "--", "true")
    assert image.returncode == 1 and f"error: --image alpine:3: {refusal}" in image.stderr
    api.on("PUT", "/v1/projects/p", (400, {"error": "limit below the quota", "field": "limit"}))
    limit = fairlane(api, "project", "set", "p", "--quota", "4", "--limit", "2")
    assert "error: --limit 2: limit below the quota" in limit.stderr


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (["describe", ""], "JOB ''"),  # GET /v1/jobs/: the job list, read as a job
        (["describe", "?"], "JOB '?'"),
        (["logs", "j?attempt=1"], "JOB 'j?attempt=1'"),  # the job's JSON, printed as its logs
        (["pause", "a/b"], "JOB 'a/b'"),
        (["delete", "j", "?"], "JOB '?'"),  # refused before j is deleted
        (["update", "", "--priority", "3"], "JOB ''"),
        (["events", "--job", ""], "--job ''"),  # every event, unfiltered
        (["events", "--node", "a b"], "--node 'a b'"),
        (["project", "set", "a/b", "--quota", "1"], "NAME 'a/b'"),
        (["projects", ""], "NAME ''"),  # every project
        (["node", "cordon", "#"], "NAME '#'"),
        (["token", "revoke", "t", "../t"], "NAME '../t'"),  # refused before t is revoked
    ],
)
def test_a_name_that_would_change_the_api_path_is_refused_before_anything_is_sent(
    api: FakeApi, args: list[str], bad: str
) -> None:
    done = fairlane(api, *args)
    assert done.returncode == 2, done.stderr
    assert f"error: {bad} is not a valid name: use 1-128 letters" in done.stderr, done.stderr
    assert api.requests == []


def test_the_command_lines_name_pattern_is_the_policys() -> None:
    from fairlane.client import NAME  # noqa: PLC0415  (what the test is about)
    from policy.commands.names import PATTERN  # noqa: PLC0415

    assert f"^{NAME.pattern}$(?!\\n)" == PATTERN


def test_api_errors_about_an_item_or_a_long_value_name_the_flag_and_cut_the_value(
    api: FakeApi,
) -> None:
    long = "x" * 5000
    api.on("POST", "/v1/jobs", (400, {"error": "command[1]: Expected `str` of length <= 4096 "
                                       "(in body)", "field": "command[1]"}))  # fmt: skip
    item = fairlane(api, "submit", "j", "--project", "p", "--", "true", long)
    assert item.returncode == 2, item.stderr
    assert f"error: --command {'x' * 60}…: command[1]: Expected" in item.stderr, item.stderr
    api.on("POST", "/v1/jobs", (400, {"error": "env[...]: Expected `str` of length <= 4096 "
                                       "(in body)", "field": "env[...]"}))  # fmt: skip
    env = fairlane(api, "submit", "j", "--project", "p", "-e", f"A={long}")
    assert "error: --env: env[...]: Expected" in env.stderr, env.stderr
    api.on("POST", "/v1/jobs", (400, {"error": "idempotency_key: too long",
                                       "field": "idempotency_key"}))  # fmt: skip
    key = fairlane(api, "submit", "j", "--project", "p", "--idempotency-key", long)
    assert f"error: --idempotency-key {'x' * 60}…: idempotency_key: too long" in key.stderr
    assert len(key.stderr) < 500, key.stderr  # the 5,000 characters are not all repeated


def test_the_client_goes_through_the_proxy_the_environment_names(api: FakeApi) -> None:
    """As httpx did: HTTP_PROXY (here the stand-in API plays the proxy, which is sent the
    whole URL), and NO_PROXY for the hosts to reach directly."""
    proxied = {"FAIRLANE_API": "http://api.invalid:8080", "HTTP_PROXY": api.url}
    done = fairlane(api, "list", env=proxied)
    assert done.returncode == 0 and "no jobs" in done.stdout, done.stderr
    assert len(api.sent("GET", "/v1/jobs")) == 1  # it was the proxy that was asked
    bypassed = fairlane(api, "list", env={**proxied, "NO_PROXY": "localhost,.invalid"})
    assert bypassed.returncode == 1 and "cannot reach the Fairlane API" in bypassed.stderr


def _timeline(entries: list[dict[str, object]]) -> Callable[[Request], tuple[int, object]]:
    """A timeline route over `entries` that pages as the API does (after; newest/before)."""

    def answer(request: Request) -> tuple[int, object]:
        q = {k: v[-1] for k, v in request.query.items()}
        types = request.query.get("type")
        found = [e for e in entries if not types or e["type"] in types]
        found = [e for e in found if float(str(e["time"])) >= float(q.get("since", 0))]
        found = [e for e in found if int(str(e["seq"])) > int(q.get("after", 0))]
        found = [e for e in found if int(str(e["seq"])) < int(q.get("before", 1 << 62))]
        limit = int(q.get("limit", 100))
        if q.get("newest") == "true":
            page, more = found[-limit:], len(found) > limit
            return 200, {"items": page, "next": page[0]["seq"] if more else None}
        page, more = found[:limit], len(found) > limit
        return 200, {"items": page, "next": page[-1]["seq"] if more else None}

    return answer


def entry(seq: int, kind: str, job: str | None = "j", **event: object) -> dict[str, object]:
    return {"seq": seq, "time": 1_000_000.0 + seq, "type": kind, "actor": "someone",
            "job_id": job, "project": "p", "pool": "default", "nodes": [], "reason": None,
            "for_job": None, "applied": True, "event": {"type": kind, **event}}  # fmt: skip


def test_events_shows_the_newest_and_says_what_it_left_out(api: FakeApi) -> None:
    api.on("GET", "/v1/timeline", _timeline([entry(s, "JobStarted", attempt=s) for s in
                                             range(1, 251)]))  # fmt: skip
    newest = fairlane(api, "events", "-o", "json")
    assert [e["seq"] for e in json.loads(newest.stdout)] == list(range(151, 251))
    assert "the newest 100 events are shown; earlier ones were left out" in newest.stderr
    table = fairlane(api, "events", "--limit", "3").stdout.splitlines()
    assert [line.split()[1] for line in table[1:]] == ["248", "249", "250"]
    every = fairlane(api, "events", "--limit", "300", "-o", "json")
    assert len(json.loads(every.stdout)) == 250 and "left out" not in every.stderr
    since = fairlane(api, "events", "--since", "1000200", "--limit", "20", "-o", "json")
    assert [e["seq"] for e in json.loads(since.stdout)] == list(range(200, 220))
    assert "the first 20 events from 1000200 on are shown; later ones" in since.stderr
    api.requests.clear()
    fairlane(api, "events", "--since", "10m", "--type", "JobStarted")
    (sent,) = api.sent("GET", "/v1/timeline")
    assert sent.query["type"] == ["JobStarted"] and "newest" not in sent.query
    assert abs(float(sent.query["since"][0]) - (time.time() - 600)) < 60
    bad = fairlane(api, "events", "--since", "yesterday")
    assert bad.returncode == 2 and "--since takes a time" in bad.stderr
    assert "'yesterday'" in bad.stderr


def failed_job() -> dict[str, object]:
    return {"job_id": "j", "project": "p", "pool": "default", "pools": [], "state": "failed",
            "priority": 50, "preemptible": True, "gpus": 1, "replicas": 1, "min_replicas": 1,
            "attempt": 2, "gpus_held": 0, "nodes": [], "submitted_at": 1.0, "state_since": 2.0,
            "queued_s": 1.0, "running_s": 5.0, "gpu_hours": 0.0, "preemptions": 0,
            "first_started_at": 1.5, "last_seq": 9, "waiting": "", "pending_reason": None,
            "reject_reason": None}  # fmt: skip


def test_describe_of_a_failed_job_says_why(api: FakeApi) -> None:
    api.on("GET", "/v1/jobs/j", (200, failed_job()))
    api.on("GET", "/v1/jobs/j/timeline", _timeline([
        entry(1, "JobFailed", attempt=1, exit_code=2, reason="bad config"),
        entry(2, "JobFailed", attempt=2, reason="exited with status 1"),  # exit code 1: left out
    ]))  # fmt: skip
    output = "".join(f"line {n}\n" for n in range(1, 41)) + "Traceback: ZeroDivisionError\n"
    api.on("GET", "/v1/jobs/j/logs", (200, output.encode()))
    said = fairlane(api, "describe", "j")
    assert said.returncode == 0, said.stderr
    assert "Failed     exit code 1: exited with status 1 (attempt 2)" in said.stdout
    assert "Traceback: ZeroDivisionError" in said.stdout and "line 32" in said.stdout
    assert "line 31\n" not in said.stdout  # the last 10 lines only
    (logs,) = api.sent("GET", "/v1/jobs/j/logs")
    assert logs.query["attempt"] == ["2"]
    failure = json.loads(fairlane(api, "describe", "j", "-o", "json").stdout)["failure"]
    assert failure["exit_code"] == 1 and failure["output_tail"][-1].startswith("Traceback")


def test_describe_events_folds_progress_and_tells_every_event_in_words(api: FakeApi) -> None:
    running = {**failed_job(), "state": "running"}
    api.on("GET", "/v1/jobs/j", (200, running))
    timeline = [
        entry(1, "JobSubmitted", spec={"project": "p", "gpus": 1}),
        entry(2, "JobScheduled", attempt=1, pool="default", replicas=[["n1", [0]]]),
    ]
    timeline += [
        entry(3 + n, "JobProgress", attempt=1, step=n, metrics={"loss": 1 / (n + 1)})
        for n in range(423)
    ]
    seq = len(timeline) + 1
    timeline += [entry(seq, "JobCheckpointed", attempt=1, step=422, save_s=1.5),
                 entry(seq + 1, "JobProgress", attempt=1, step=423),
                 entry(seq + 2, "NodeLost", node="n1", reason="no heartbeat")]  # fmt: skip
    api.on("GET", "/v1/jobs/j/timeline", _timeline(timeline))
    said = fairlane(api, "describe", "j", "--events")
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    assert sum("JobProgress" in line for line in lines) == 2  # one per run of reports
    assert "step 422, loss 0.00236407 (latest of 423 progress reports)" in said.stdout
    assert "node n1 lost (no heartbeat); attempt 1 ended there and the job queues again" in (
        said.stdout
    )
    assert "{" not in said.stdout
    assert "checkpoint of attempt 1 saved at step 422 in 1.5 s" in said.stdout
    few = fairlane(api, "describe", "j", "--events", "--limit", "2", "-o", "json")
    assert [e["type"] for e in json.loads(few.stdout)["events"]] == ["JobProgress", "NodeLost"]
    assert "the newest 2 events are shown" in few.stderr
    only = fairlane(api, "describe", "j", "--events", "--type", "JobCheckpointed", "-o", "json")
    assert [e["type"] for e in json.loads(only.stdout)["events"]] == ["JobCheckpointed"]


def _admitted(request: Request) -> tuple[int, object]:
    body = request.body
    event = {"job_id": body["job_id"], "priority": 50, "pools": ["default"]}
    return 201, {"type": "JobAdmitted", "event": event}


def test_submit_a_job_spec_from_a_file_flags_winning(api: FakeApi, tmp_path: Path) -> None:
    api.on("POST", "/v1/jobs", _admitted)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: train-1\nproject: team-a\nclass: train\ngpus: 2\nmin_replicas: 1\nreplicas: 2\n"
        "pool: [a100, default]\ncommand: [python3, train.py, --lr, '0.1']\n"
        f"env: {{WANDB_MODE: offline}}\ngrace: 5\nworking-dir: {tmp_path}\n"
    )
    done = fairlane(api, "submit", "-f", str(spec), "--gpus", "4", "-e", "SEED=1")
    assert done.returncode == 0, done.stderr
    assert "job train-1 admitted" in done.stdout
    (sent,) = api.sent("POST", "/v1/jobs")
    assert sent.body == {
        "job_id": "train-1", "project": "team-a", "gpus": 4, "replicas": 2,
        "command": ["python3", "train.py", "--lr", "0.1"], "pools": ["a100", "default"],
        "class": "train", "min_replicas": 1, "grace_s": 5.0,
        "env": {"WANDB_MODE": "offline", "SEED": "1"},
        "working_dir": str(tmp_path),  # the file's folder, absolute (the API is local)
    }  # fmt: skip
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: x\nproject: p\ngpu: 2\n")
    bad = fairlane(api, "submit", "-f", str(typo))
    assert bad.returncode == 2 and f"-f {typo}: unknown field 'gpu' (did you mean gpus?)" in (
        bad.stderr
    )
    half = tmp_path / "half.yaml"
    half.write_text("name: x\nproject: p\ngpus: 0.5\n")
    assert (
        "gpus 0.5: fractional GPUs are not supported yet"
        in fairlane(api, "submit", "-f", str(half)).stderr
    )
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: x\nproject: p\nreplicas: many\n")
    assert (
        "replicas: expected `int | null`, got `str`"
        in fairlane(api, "submit", "-f", str(wrong)).stderr
    )
    assert len(api.sent("POST", "/v1/jobs")) == 1  # none of the bad files was sent


def test_a_default_project_from_the_environment_or_the_config(api: FakeApi, tmp_path: Path) -> None:
    api.on("POST", "/v1/jobs", _admitted)
    nowhere = fairlane(api, "submit", "j", "--", "true")
    assert nowhere.returncode == 2 and "which project? give --project NAME" in nowhere.stderr
    fairlane(api, "submit", "j1", env={"FAIRLANE_PROJECT": "team-env"})
    config = tmp_path / "config.yaml"
    config.write_text("project: team-config\n")
    fairlane(api, "submit", "j2", env={"FAIRLANE_CONFIG": str(config)})
    fairlane(api, "list", env={"FAIRLANE_CONFIG": str(config)})
    sent = api.sent("POST", "/v1/jobs")
    assert [r.body["project"] for r in sent] == ["team-env", "team-config"]
    assert api.sent("GET", "/v1/jobs")[-1].query["project"] == ["team-config"]


def test_update_the_priority_of_a_job(api: FakeApi) -> None:
    changed = {"type": "JobPriorityChanged", "event": {"job_id": "j", "priority": 80}}
    api.on("PATCH", "/v1/jobs/j", (200, changed))
    done = fairlane(api, "update", "j", "--priority", "80")
    assert done.returncode == 0 and "job j changed: priority 80 (JobPriorityChanged)" in (
        done.stdout
    )
    assert api.sent("PATCH", "/v1/jobs/j")[0].body == {"priority": 80}
    nothing = fairlane(api, "update", "j")
    assert nothing.returncode == 2 and "--priority N" in nothing.stderr
    api.on("PATCH", "/v1/jobs/j", (422, {"error": "job 'j' has priority 80 already",
                                         "field": "priority"}))  # fmt: skip
    again = fairlane(api, "update", "j", "--priority", "80")
    assert again.returncode == 1 and "--priority 80: job 'j' has priority 80 already" in (
        again.stderr
    )


def _cancelled(request: Request) -> tuple[int, object]:
    job = request.path.rsplit("/", 1)[-1]
    if job == "ghost":
        return 404, {"error": "unknown job id 'ghost'", "field": "job_id"}
    return 200, {"type": "JobCancelled", "event": {"job_id": job}}


def test_delete_several_jobs_or_all_of_a_project(api: FakeApi) -> None:
    for job in ("a", "b", "c", "ghost", "done"):
        api.on("DELETE", f"/v1/jobs/{job}", _cancelled)
    two = fairlane(api, "delete", "a", "b")
    assert two.returncode == 0 and "job a deleted" in two.stdout and "job b deleted" in two.stdout
    partly = fairlane(api, "delete", "c", "ghost", "-o", "json")
    assert partly.returncode == 1 and "job ghost: unknown job id 'ghost'" in partly.stderr
    assert [a["event"]["job_id"] for a in json.loads(partly.stdout)] == ["c"]
    jobs = [{"job_id": j, "state": s} for j, s in (("a", "running"), ("done", "completed"))]
    api.on("GET", "/v1/jobs", (200, {"items": jobs, "next": None}))
    api.requests.clear()
    every = fairlane(api, "delete", "--all", "--project", "team-a")
    assert every.returncode == 0 and "job a deleted" in every.stdout
    assert [r.path for r in api.requests if r.method == "DELETE"] == ["/v1/jobs/a"]
    assert api.sent("GET", "/v1/jobs")[0].query["project"] == ["team-a"]
    neither = fairlane(api, "delete")
    assert neither.returncode == 2 and "name the jobs to delete, or give --all" in neither.stderr


def test_logs_tail_and_since(api: FakeApi) -> None:
    api.on("GET", "/v1/jobs/j", (200, {**failed_job(), "state": "running"}))
    api.on("GET", "/v1/jobs/j/logs", (200, b"".join(b"line %d\n" % n for n in range(1, 31))))
    tail = fairlane(api, "logs", "j", "--tail", "3")
    assert tail.stdout == "line 28\nline 29\nline 30\n"
    fairlane(api, "logs", "j", "--since", "2h")
    sent = api.sent("GET", "/v1/jobs/j/logs")[-1]
    assert abs(float(sent.query["since"][0]) - (time.time() - 7200)) < 60
    api.on("GET", "/v1/jobs/j/logs", (404, {"error": "job 'j' has had 2 attempt(s), not 5",
                                            "field": "attempt"}))  # fmt: skip
    later = fairlane(api, "logs", "j", "--attempt", "5")
    assert "error: --attempt 5: job 'j' has had 2 attempt(s), not 5" in later.stderr
    bad = fairlane(api, "logs", "j", "--since", "soon")
    assert bad.returncode == 2 and "--since takes a time" in bad.stderr


def test_login_whoami_and_tokens(api: FakeApi, tmp_path: Path) -> None:
    me = {"name": "ann", "admin": False, "projects": ["team-a"], "expires_at": None}
    api.on("GET", "/v1/whoami", (200, me))
    config = tmp_path / "fairlane" / "config.yaml"
    env = {"FAIRLANE_CONFIG": str(config)}
    login = fairlane(None, "login", "--api", api.url, "--token", "fl_ann", "--project",
                     "team-a", env=env)  # fmt: skip
    assert login.returncode == 0, login.stderr
    assert f"logged in to {api.url} as ann" in login.stdout
    assert config.stat().st_mode & 0o777 == 0o600
    assert set(config.read_text().splitlines()) == {
        f"api: {api.url}",
        "token: fl_ann",
        "project: team-a",
    }
    who = fairlane(None, "whoami", env=env)  # the config file says where and who
    assert who.returncode == 0 and "ann" in who.stdout and "team-a" in who.stdout
    assert f"from the config file {config}" in who.stdout
    api.on("GET", "/v1/whoami", (401, {"error": "unknown API token", "field": "Authorization"}))
    refused = fairlane(None, "login", "--api", api.url, "--token", "fl_bad",
                       env={"FAIRLANE_CONFIG": str(tmp_path / "other.yaml")})  # fmt: skip
    assert refused.returncode == 1 and not (tmp_path / "other.yaml").exists()

    made = {"name": "ci", "token": "fl_secret", "projects": ["team-a"], "admin": False,
            "expires_at": time.time() + 30 * 86400}  # fmt: skip
    api.on("POST", "/v1/tokens", (201, made))
    create = fairlane(api, "token", "create", "ci", "--project", "team-a", "--expires", "30d")
    assert (
        create.returncode == 0 and "fl_secret" in create.stdout and "in 29d23h" in (create.stdout)
    )
    assert api.sent("POST", "/v1/tokens")[0].body == {
        "name": "ci", "projects": ["team-a"], "admin": False, "expires_in_s": 30 * 86400.0
    }  # fmt: skip
    bad = fairlane(api, "token", "create", "ci", "--project", "a", "--expires", "soon")
    assert bad.returncode == 2 and "--expires takes a length of time" in bad.stderr
    listed = [{**made, "created_at": time.time() - 3 * 3600 - 10}]  # (the minute holds)
    del listed[0]["token"]
    api.on("GET", "/v1/tokens", (200, listed))
    table = fairlane(api, "token", "list").stdout
    assert "ci" in table and "team-a" in table and "3h00m ago" in table
    api.on("DELETE", "/v1/tokens/ci", (200, listed[0]))
    assert "token ci revoked" in fairlane(api, "token", "revoke", "ci").stdout


def test_volumes_from_flags_and_files_and_the_allowlist_verbs(api: FakeApi, tmp_path: Path) -> None:
    api.on("POST", "/v1/jobs", _admitted)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: reads\nproject: p\nvolume: [/datasets/imagenet:/data]\n")
    done = fairlane(api, "submit", "-f", str(spec), "--volume", "/scratch/me:/out:rw",
                    "--volume", "/models")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert api.sent("POST", "/v1/jobs")[0].body["volumes"] == [
        {"host": "/datasets/imagenet", "container": "/data", "read_only": True},
        {"host": "/scratch/me", "container": "/out", "read_only": False},
        {"host": "/models", "container": "/models", "read_only": True},
    ]
    for value in ("/a:/b:rx", "/a:"):
        bad = fairlane(api, "submit", "j", "--project", "p", "--volume", value)
        assert bad.returncode == 2 and f"{value!r}" in bad.stderr and "--volume" in bad.stderr
    refusal = "volume /etc:/etc:ro: host path /etc is not under an allowed prefix (allowed: none"
    api.on("POST", "/v1/jobs", (422, {"error": refusal, "field": "volumes"}))
    named = fairlane(api, "submit", "j", "--project", "p", "--volume", "/etc")
    assert named.returncode == 1 and f"error: --volume /etc: {refusal}" in named.stderr
    assert len(api.sent("POST", "/v1/jobs")) == 2  # the malformed ones were never sent
    grants = {"grants": [{"prefix": "/datasets", "read_write": False}]}
    api.on("POST", "/v1/volumes", (200, {"type": "VolumesConfigured", "event": grants}))
    allowed = fairlane(api, "volumes", "allow", "/datasets")
    assert allowed.returncode == 0 and "/datasets    read-only" in allowed.stdout, allowed.stderr
    assert api.sent("POST", "/v1/volumes")[0].body == {"host_prefix": "/datasets",
                                                       "read_write": False}  # fmt: skip
    api.on("DELETE", "/v1/volumes", (422, {"error": "not allowed now", "field": "host_prefix"}))
    denied = fairlane(api, "volumes", "deny", "/a b")
    assert denied.returncode == 1 and "HOST_PREFIX /a b: not allowed now" in denied.stderr
    assert api.sent("DELETE", "/v1/volumes")[0].query == {"prefix": ["/a b"]}
    api.on("GET", "/v1/jobs/j", (200, {**failed_job(), "volumes": ["/datasets:/data:ro"]}))
    api.on("GET", "/v1/jobs/j/timeline", _timeline([]))
    api.on("GET", "/v1/jobs/j/logs", (200, b""))
    assert "Volumes    /datasets:/data:ro" in fairlane(api, "describe", "j").stdout


def test_scenario_run_takes_a_folder_as_every_scenario_under_it(tmp_path: Path) -> None:
    examples = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))[:2]
    (tmp_path / "deeper").mkdir()
    (tmp_path / "b.yaml").write_bytes(examples[0].read_bytes())
    (tmp_path / "deeper" / "a.yml").write_bytes(examples[1].read_bytes())
    (tmp_path / "notes.txt").write_text("not a scenario")
    done = fairlane(None, "scenario", "run", str(tmp_path), "-o", "json")
    assert done.returncode == 0, done.stderr
    ran = [Path(r["path"]).relative_to(tmp_path) for r in json.loads(done.stdout)]
    assert ran == [Path("b.yaml"), Path("deeper/a.yml")]
    empty = tmp_path / "deeper" / "empty"
    empty.mkdir()
    refused = fairlane(None, "scenario", "run", str(empty))
    assert refused.returncode == 2
    assert f"error: FILES: the folder '{empty}' holds no scenario file" in refused.stderr
