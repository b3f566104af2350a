"""What the executor's workload endpoint takes from a workload: the pure check of its body."""

from __future__ import annotations

import msgspec
import pytest

from services.executor.workload_events import EventRefused, parse


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "m1", "kind": "message", "text": "half\u0000way"}, "$.text"),
        ({"id": "p1", "kind": "progress", "metrics": {"lo\u0000ss": 0.5}}, "$.metrics"),
        ({"id": "p1\n", "kind": "progress"}, "$.id"),
    ],
)
def test_text_the_read_models_cannot_hold_is_refused(body: dict[str, object], field: str) -> None:
    with pytest.raises(EventRefused) as refused:
        parse(msgspec.json.encode(body))
    assert refused.value.status == 400
    assert f"`{field}" in refused.value.reason, refused.value.reason


def test_a_nul_is_named_in_words() -> None:
    with pytest.raises(EventRefused, match="without the NUL character"):
        parse(msgspec.json.encode({"id": "m1", "kind": "message", "text": "\u0000"}))


def test_ordinary_events_pass() -> None:
    assert parse(msgspec.json.encode({"id": "m1", "kind": "message", "text": "hi"})).text == "hi"
