"""The services' logs: an error logged with its exception carries the traceback."""

from __future__ import annotations

import json

import pytest
import structlog

from services.runtime.main import configure_logging


def test_an_error_log_carries_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    nothing: dict[str, int] = {}
    try:
        try:
            nothing["missing"]  # the failure logged
        except KeyError:
            structlog.get_logger("test").exception("request failed", path="/v1/jobs")
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        structlog.reset_defaults()
    logged = json.loads(line)
    assert logged["event"] == "request failed" and logged["level"] == "error"
    assert "Traceback (most recent call last)" in logged["exception"]
    assert "KeyError: 'missing'" in logged["exception"]
