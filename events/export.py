"""The export format of a log: JSON lines, one stored event each with its stream sequence.

`{"seq": 17, "event": {...the event as stored...}}`. Events are read through
`events.versions.decode_event`, so an export written by an older version is upcast and one
written by a newer version is read tolerantly. A line that is no event of a known type is an
`ExportError` naming the line: an audit of a log with a hole in it would prove nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

from events.catalogue import AnyEvent, Event, encode_event
from events.versions import NotAnEvent, Undecodable, decode_event

#: The longest line read (a bound on bad input; the largest events are a few KiB).
MAX_LINE_BYTES: Final = 1 << 20


class ExportError(ValueError):
    """A line of an export that cannot be read."""


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    seq: int
    event: msgspec.Raw


def export_line(seq: int, event: Event) -> bytes:
    """One line of an export, with its newline."""
    return b'{"seq":%d,"event":%s}\n' % (seq, encode_event(event))


_decoder = msgspec.json.Decoder(_Line)


def read_export(lines: Iterable[bytes]) -> Iterator[tuple[int, AnyEvent]]:
    """The (sequence, event) pairs of an export, in its order; blank lines are skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise ExportError(f"line {number}: longer than {MAX_LINE_BYTES} bytes")
        try:
            entry = _decoder.decode(line)
            if entry.seq < 1:
                raise ExportError(f"line {number}: sequence {entry.seq} is not positive")
            yield entry.seq, decode_event(entry.event)
        except (msgspec.DecodeError, NotAnEvent, Undecodable) as e:
            raise ExportError(f"line {number}: {e}") from None
