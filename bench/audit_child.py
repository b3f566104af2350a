"""One audit of an export, in a process of its own, for bench/audit.py: run by
`bench.revision.child_output` on the code of a tree (this one, or a git revision checked out),
it prints its `Run` as JSON. A process of its own for each audit, so that its peak memory (its
own maxrss) is that audit's alone; it imports only what the audit needs, so it starts fast.

`whole`: the log read into a list first, then audited (as the audit ran before it streamed;
every revision's `audit` takes a list); otherwise handed over as a reader from a position on,
which the streaming audit reads as it folds.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from events import Event
from events.export import read_export
from policy.audit import audit


class Run(msgspec.Struct, frozen=True):
    """One audit of the export, in a process of its own: reading and decoding it included."""

    seconds: float
    decisions_per_s: int
    events_per_s: int
    #: the process's peak resident memory (its own maxrss), and before it read the log
    peak_mib: float
    start_mib: float
    checked: int
    matched: int
    plans: int


class Request(msgspec.Struct, frozen=True):
    path: str
    whole: bool


def read_file(path: Path) -> Iterator[tuple[int, Event]]:
    with path.open("rb") as lines:
        yield from read_export(lines)


def one(path: Path, whole: bool) -> Run:
    """Audit the export at `path`, read whole or as it goes; reading and decoding it count."""
    start_mib = _peak_mib()
    began = time.perf_counter()
    if whole:
        report = audit(list(read_file(path)))
    else:
        report = audit(lambda first: (p for p in read_file(path) if p[0] >= first))
    took = time.perf_counter() - began
    return Run(
        seconds=round(took, 2),
        decisions_per_s=round(report.checked / took),
        events_per_s=round(report.events / took),
        peak_mib=_peak_mib(),
        start_mib=start_mib,
        checked=report.checked,
        matched=report.matched,
        plans=report.plans,
    )


def _peak_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # KiB on Linux


def child(request: str) -> None:
    """In a child of bench/audit.py (`bench.revision.child_output`): one audit, as JSON."""
    asked = msgspec.json.decode(request, type=Request)
    sys.stdout.write(msgspec.json.encode(one(Path(asked.path), asked.whole)).decode())
