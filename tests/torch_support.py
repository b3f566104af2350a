"""PyTorch for the tests that run the PyTorch example (examples/train_torch.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_torch() -> None:
    """PyTorch is not a dependency (only the example uses it): skip without it, but with
    CI=true fail, since `.ci/torch` installs it there."""
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("torch is not installed (CI=true: run .ci/torch first)")
        pytest.skip("torch is not installed (.ci/torch installs its CPU build)")
