"""The browser tests' own rule: without a browser they skip, but with CI=true they fail."""

from __future__ import annotations

import shutil

import pytest

from tests.dashboard_support import binaries


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium"):
        binaries()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="chromium"):
        binaries()
