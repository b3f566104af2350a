"""Benchmark: how long a `fairlane` command takes from the shell prompt to its answer.

Times `python -m fairlane.cli list` against a tiny local HTTP server that answers like the
API (an empty job list), and `python -m fairlane.cli list --help`, for this checkout and for
an older commit (checked out with `git worktree` into a temporary folder), alternating the
two so that a busy machine slows both alike. Prints the median of each and the ratio.

Both run with their bytecode compiled, as an installed command does (into a temporary
PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is set: otherwise every run would
compile every module it imports, which is most of what it would time).

    uv run python -m bench.cli_startup [--baseline 591ba75] [--runs 15] [--no-bytecode] [-o json]
"""

from __future__ import annotations

import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import cyclopts

ROOT = Path(__file__).resolve().parent.parent
#: The last commit before the command line's imports were made lazy.
BEFORE = "591ba75"


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """Answers GET /v1/jobs with an empty page and GET /v1/gpus with no samples, as the API
    does on an empty cluster."""

    def do_GET(self) -> None:
        empty: dict[str, Any] = (
            {"nodes": [], "jobs": []}
            if self.path.startswith("/v1/gpus")
            else {"items": [], "next": None}
        )
        body = json.dumps(empty).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:  # quiet: the benchmark prints its own figures
        pass


@contextmanager
def fake_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """The tree of `commit`, as a detached worktree in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="fairlane-bench-") as folder:
        tree = Path(folder) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", "--quiet", str(tree), commit],
                       check=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


def once(tree: Path, args: list[str], cache: Path | None) -> float:
    """Seconds one command takes, its tree first on the import path; with no `cache`, every
    module compiled from its source (as where PYTHONDONTWRITEBYTECODE is set)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "FAIRLANE_CONFIG": os.devnull}
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fairlane.cli", *args], cwd=tree, env=env,
                          capture_output=True, check=False)  # fmt: skip
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"fairlane {' '.join(args)} in {tree} failed:\n{done.stderr.decode()}")
    return took


def main(
    *,
    baseline: str = BEFORE,
    runs: int = 15,
    bytecode: bool = True,
    output: Annotated[Literal["table", "json"], cyclopts.Parameter(name=["-o", "--output"])] = (
        "table"
    ),
) -> None:
    """Time `fairlane list` and `fairlane list --help` here and at `baseline`.

    Parameters
    ----------
    baseline
        The older commit to compare with.
    runs
        Runs of each command in each tree (the median is reported).
    bytecode
        Run with compiled bytecode, as an installed command does; --no-bytecode compiles every
        module at every run (PYTHONDONTWRITEBYTECODE), the slowest case.
    """
    with (
        fake_api() as url,
        checkout(baseline) as old,
        tempfile.TemporaryDirectory(prefix="fairlane-pyc-") as cache,
    ):
        commands = {
            "list": ["list", "--api", url, "--token", "bench"],
            "list --help": ["list", "--help"],
        }
        times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        for name, args in commands.items():
            for which, tree in (("before", old), ("after", ROOT)):
                once(
                    tree, args, Path(cache) if bytecode else None
                )  # warm the file cache and the bytecode
                times[which][name] = []
            for _ in range(runs):
                for which, tree in (("before", old), ("after", ROOT)):
                    took = once(tree, args, Path(cache) if bytecode else None)
                    times[which][name].append(took)
    figures = {
        name: {
            "before_s": round(statistics.median(times["before"][name]), 3),
            "after_s": round(statistics.median(times["after"][name]), 3),
        }
        for name in commands
    }
    for f in figures.values():
        f["ratio"] = round(f["before_s"] / f["after_s"], 2)
    if output == "json":
        doc = {"baseline": baseline, "runs": runs, "bytecode": bytecode, "figures": figures}
        print(json.dumps(doc))
        return
    how = "" if bytecode else ", no bytecode"
    print(f"fairlane startup, median of {runs} runs{how} (before: {baseline}; after: this "
          "checkout)")  # fmt: skip
    for name, f in figures.items():
        print(f"  {name:12} before {f['before_s']:.3f} s  after {f['after_s']:.3f} s  "
              f"{f['ratio']:.1f}x faster")  # fmt: skip


if __name__ == "__main__":
    cyclopts.run(main)
