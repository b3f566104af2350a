"""The command line's edges, as a new user meets them, against a stand-in for the API (see
tests/fake_api.py): how fast a command starts, what it sends, and what a person is shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_api import FakeApi, fairlane, fake_api


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
    api.on("PUT", "/v1/projects/p", (400, {"error": "limit below the quota", "field": "limit"}))
    limit = fairlane(api, "project", "set", "p", "--quota", "4", "--limit", "2")
    assert "error: --limit 2: limit below the quota" in limit.stderr
