"""One audit of an export, in this process, for bench/audit.py: `python -m bench.audit_child
baseline|streaming FILE` prints its `Run` as JSON. A process of its own for each, so that its
peak memory (its own maxrss) is that audit's alone; it imports only what the audit needs, so
it starts fast.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from bench import audit_baseline
from events import Event
from events.export import read_export
from policy.audit import audit

Which = Literal["baseline", "streaming"]


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


def read_file(path: Path) -> Iterator[tuple[int, Event]]:
    with path.open("rb") as lines:
        yield from read_export(lines)


def one(which: Which, path: Path) -> Run:
    """Audit the export at `path` with the `which` audit; reading and decoding it count."""
    start_mib = _peak_mib()
    began = time.perf_counter()
    if which == "baseline":  # as it was: the whole log read into memory, then audited
        old = audit_baseline.audit(list(read_file(path)))
        counts = (old.events, old.checked, old.matched, old.plans)
    else:
        new = audit(lambda first: (p for p in read_file(path) if p[0] >= first))
        counts = (new.events, new.checked, new.matched, new.plans)
    took = time.perf_counter() - began
    events, checked, matched, plans = counts
    return Run(
        seconds=round(took, 2),
        decisions_per_s=round(checked / took),
        events_per_s=round(events / took),
        peak_mib=_peak_mib(),
        start_mib=start_mib,
        checked=checked,
        matched=matched,
        plans=plans,
    )


def _peak_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # KiB on Linux


if __name__ == "__main__":
    which, path = sys.argv[1], Path(sys.argv[2])
    if which not in ("baseline", "streaming"):
        raise SystemExit(f"which audit: {which!r} is neither baseline nor streaming")
    sys.stdout.write(msgspec.json.encode(one(which, path)).decode())  # type: ignore[arg-type]
