"""The examples' scripts, played through where there is no GPU: each names the commands a
user runs, so a change to one of them (a flag, a state's name, a field of `-o json`) must not
break it unnoticed. On a GPU machine they are run by hand (docs/executor.md, "On a real GPU")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torch_support import require_torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_work_moves_between_two_nodes_in_the_gpu_example_on_cpus(tmp_path: Path) -> None:
    """examples/gpu_across_nodes.sh on CPUs (its workloads fall back to them): a job reclaimed
    on one node resumes on the other from its checkpoint, a gang of two meets over gloo and,
    paused and resumed, goes on from one step, and the audit finds every decision the
    policy's. Jobs run as the cluster's user here (as `make demo`'s do)."""
    require_torch()
    env = {
        **os.environ,
        "FAIRLANE": f"{sys.executable} -m fairlane.cli",
        "PYTHON": sys.executable,
        "UP_FLAGS": "--insecure-same-user",
    }
    script = str(EXAMPLES / "gpu_across_nodes.sh")
    done = subprocess.run(
        [script, str(tmp_path / "fl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    moved = next(line for line in out.splitlines() if line.startswith("borrow attempt 2 runs on"))
    first, second = moved.split(" runs on ")[1].split(" (attempt 1 ran on ")
    assert first != second.rstrip(")")  # it resumed on the other node
    resumed = [line for line in out.splitlines() if "resumed from step" in line]
    assert any(line.startswith("attempt 2: resumed from step") for line in resumed)
    met = {line.split(" met at ")[1] for line in out.splitlines() if " met at " in line}
    assert len(met) == 1 and "over gloo" in next(iter(met))
    gang = [line.split("] ")[1] for line in resumed if line.startswith("[replica ")]
    assert len(gang) == 2 and gang[0] == gang[1]  # both replicas from the same step
    assert "every decision checked is what the policy gives" in out
