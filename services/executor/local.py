"""A replica's checkpoint marker on this node: the `.checkpoint` file a workload touches after
it saved, whose mtime says when."""

from __future__ import annotations

from pathlib import Path
from typing import Final

CHECKPOINT_MARKER: Final = ".checkpoint"


def marker_mtime(directory: Path) -> float | None:
    try:
        return (directory / CHECKPOINT_MARKER).stat().st_mtime
    except OSError:
        return None
