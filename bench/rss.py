"""Resident memory of a process, from Linux's /proc: now (`VmRSS`), and the most it has held
since it started (`VmHWM`, kept by the kernel, so a peak between two looks is not missed).
Elsewhere (no /proc), and for a process that is gone, None.
"""

from __future__ import annotations

from pathlib import Path


def _status_kib(pid: int | str, key: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def _mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def rss_mib(pid: int | str = "self") -> float | None:
    """The resident set now, MiB."""
    return _mib(_status_kib(pid, "VmRSS"))


def peak_mib(pid: int | str = "self") -> float | None:
    """The peak resident set over the process's life, MiB."""
    return _mib(_status_kib(pid, "VmHWM"))
