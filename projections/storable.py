"""Rows as PostgreSQL can hold them: any text the log holds is stored.

PostgreSQL's `text` refuses the NUL character (U+0000), and `jsonb` refuses the JSON escape
`\\u0000`; the log can hold both (an event written before the edges refused them, or by an
admin). A refused row used to stop the projector for good, every read model frozen at the
event before. So each NUL becomes U+FFFD (the replacement character) in a text column, and
the escape `\\u0000` becomes `\\ufffd` in the event's JSON: the read models show where the NUL
was, and the log keeps the original.
"""

from __future__ import annotations

import re
from typing import Final, TypeVar

import msgspec

from projections.projection import Batch
from projections.rows import TimelineRow

#: What a NUL is stored as.
NUL_MARK: Final = "\ufffd"
#: `\u0000` in JSON text that is an escape (after an even number of backslashes), not the
#: literal characters `\\u0000` (an escaped backslash and "u0000").
_JSON_NUL: Final = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
_ENCODED_NUL: Final = b"\\u0000"

Row = TypeVar("Row", bound=msgspec.Struct)


def storable(batch: Batch) -> Batch:
    """`batch` with every NUL replaced (the same object when there is none, which is almost
    always: one encode of the batch tells)."""
    if _ENCODED_NUL not in msgspec.json.encode(batch):
        return batch
    return Batch(
        last_seq=batch.last_seq,
        timeline=[_row(r) for r in batch.timeline],
        jobs=[_row(r) for r in batch.jobs],
        nodes=[_row(r) for r in batch.nodes],
        project_pools=[_row(r) for r in batch.project_pools],
        over_quota=[_row(r) for r in batch.over_quota],
        preemptions=[_row(r) for r in batch.preemptions],
    )


def json_text(data: str) -> str:
    """JSON text with every `\\u0000` escape made `\\ufffd`."""
    return _JSON_NUL.sub(r"\1\\ufffd", data) if "\\u0000" in data else data


def text(value: str) -> str:
    return value.replace("\x00", NUL_MARK) if "\x00" in value else value


def _row(row: Row) -> Row:
    changes: dict[str, object] = {}
    for name in row.__struct_fields__:
        value = getattr(row, name)
        if name == "data" and isinstance(row, TimelineRow):
            cleaned: object = text(json_text(value))
        elif isinstance(value, str):
            cleaned = text(value)
        elif isinstance(value, tuple) and any(isinstance(v, str) for v in value):
            cleaned = tuple(text(v) if isinstance(v, str) else v for v in value)
        else:
            continue
        if cleaned != value:
            changes[name] = cleaned
    return msgspec.structs.replace(row, **changes) if changes else row
