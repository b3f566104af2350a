"""Running a benchmark against a git revision: that revision's code, this tree's benchmark.

`check_out` writes the files of a revision of this repository into a folder (`git archive`);
`child_output` runs one of this tree's benchmark files in a child process whose working
directory and import path are a given tree, so everything the benchmark imports (the policy,
the services it starts as processes, the executors it runs itself) is that tree's, while the
benchmark's own code, and the `bench` package it imports from, are this tree's. The child
calls the file's `child(request)`, which writes its figures to stdout.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Final

from bench.options import BadOption

ROOT: Final = Path(__file__).resolve().parent.parent

#: A child's program: the benchmark file, loaded from where the parent is, and this tree's
#: `bench` package for what it imports from it (the revision's tree, first on the path for
#: everything else, may lack a module the benchmark needs).
_CHILD: Final = """
import importlib.util, pathlib, sys
here = pathlib.Path(sys.argv[1]).parent
bench = importlib.util.spec_from_file_location(
    "bench", here / "__init__.py", submodule_search_locations=[str(here)]
)
sys.modules["bench"] = importlib.util.module_from_spec(bench)
bench.loader.exec_module(sys.modules["bench"])
spec = importlib.util.spec_from_file_location("bench_child", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
module.child(sys.argv[2])
"""


def check_out(revision: str, into: Path) -> None:
    """The files of git `revision` of this repository, written under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        error = archive.stderr.decode(errors="replace").strip()
        raise BadOption(f"--baseline: {revision!r} is no git revision of {ROOT}: {error}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def child_output(tree: Path, benchmark: Path, request: str, what: str) -> bytes:
    """What `benchmark`'s `child(request)` writes to stdout, run on the code of `tree`; its
    stderr passes through (progress). `what` names the run in the error if it fails."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(benchmark.resolve()), request],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} in {tree} failed (exit {done.returncode})")
    return done.stdout
