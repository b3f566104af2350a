"""A fake NVML for machines without an NVIDIA GPU: `tests/fake_nvml.c` built with the system
C compiler into a `libnvidia-ml.so.1`, so the executor's real pynvml code loads and calls it
as it would the driver's. The GPUs it reports are lines of a text file that a test rewrites
while the cluster runs (the library reads it on every call).

A process started with `env()` finds it by `LD_LIBRARY_PATH`; this process loads it with
`load_here()`: once a library of that soname is loaded, pynvml's `CDLL("libnvidia-ml.so.1")`
gets it. No compiler: the tests skip, or fail with `CI=true` (`.ci/run` installs one)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

SOURCE: Final = Path(__file__).with_name("fake_nvml.c")
SONAME: Final = "libnvidia-ml.so.1"
H100: Final = "NVIDIA_H100_80GB_HBM3"  # '_' is a space in the file


@dataclass(frozen=True)
class Gpu:
    uuid: str
    utilization: int | None = 0
    memory_used_mib: int | None = 0
    memory_total_mib: int | None = 81559
    temperature_c: int | None = 35
    power_mw: int | None = 70000
    name: str = H100

    def line(self) -> str:
        fields = (self.utilization, self.memory_used_mib, self.memory_total_mib,
                  self.temperature_c, self.power_mw)  # fmt: skip
        return " ".join([self.uuid, self.name, *("-" if f is None else str(f) for f in fields)])


class FakeNvml:
    """The built library and the file of GPUs it reports."""

    def __init__(self, folder: Path) -> None:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            why = "a C compiler (cc) is needed to build the fake NVML"
            if os.environ.get("CI") == "true":
                pytest.fail(f"{why} (CI=true: .ci/run installs gcc)")
            pytest.skip(why)
        folder.mkdir(parents=True, exist_ok=True)
        self.library = folder / SONAME
        self.file = folder / "gpus"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{SONAME}",
             "-o", str(self.library), str(SOURCE)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.file.write_text("")

    def set(self, gpus: list[Gpu]) -> None:
        """What the GPUs report from now on (written whole, then renamed into place)."""
        new = self.file.with_suffix(".new")
        new.write_text("".join(g.line() + "\n" for g in gpus))
        new.replace(self.file)

    def env(self) -> dict[str, str]:
        """The environment a process needs to load it instead of the driver's."""
        path = os.environ.get("LD_LIBRARY_PATH", "")
        return {
            "LD_LIBRARY_PATH": f"{self.library.parent}{os.pathsep}{path}"
            if path
            else str(self.library.parent),
            "FAKE_NVML_FILE": str(self.file),
        }

    def load_here(self) -> None:
        """Load it into this process, where pynvml will find it by its soname."""
        os.environ["FAKE_NVML_FILE"] = str(self.file)
        ctypes.CDLL(str(self.library), mode=ctypes.RTLD_GLOBAL)
