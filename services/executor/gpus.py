"""GPU discovery: NVML where there is a driver, a declared count where there is not.

A count given on the command line (`--gpus N`) always wins, so an operator can hold GPUs back
from Fairlane or run a GPU-less test node. Without one, NVML is asked; a machine with no NVIDIA
driver raises `NVMLError_LibraryNotFound` (or another NVMLError), and then the node cannot be
registered: that is an error the operator has to answer with `--gpus`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import structlog

from events.model import GpuDevice

log = structlog.get_logger("fairlane.executor.gpus")


class GpuDiscoveryError(RuntimeError):
    """Neither NVML nor a declared count said how many GPUs this node has."""


@dataclass(frozen=True, slots=True)
class GpuInventory:
    count: int
    devices: tuple[GpuDevice, ...] = ()
    source: Literal["nvml", "declared"] = "declared"

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)


def _load_nvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def describe(nvml: ModuleType, index: int) -> GpuDevice:
    """One GPU by NVML index: its UUID, model name and memory."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuDevice(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        model=_text(nvml.nvmlDeviceGetName(handle)),
        memory_mb=int(memory.total) // (1 << 20),
    )


def query_nvml(nvml: ModuleType) -> GpuInventory:
    """List the GPUs through NVML; raises `nvml.NVMLError`."""
    nvml.nvmlInit()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        devices = tuple(describe(nvml, i) for i in range(count))
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:  # the answer is already read; a failed shutdown is harmless
            log.debug("nvmlShutdown failed", error=str(e))
    return GpuInventory(count=count, devices=devices, source="nvml")


def discover_gpus(declared: int | None, nvml: ModuleType | None = None) -> GpuInventory:
    """The GPUs this node offers. `declared` (from `--gpus`) overrides NVML; `nvml` is the
    pynvml module, or a stand-in for tests (default: the real one)."""
    if declared is not None:
        if declared < 0:
            raise GpuDiscoveryError(f"--gpus must be 0 or more, not {declared}")
        return GpuInventory(count=declared, source="declared")
    module = nvml if nvml is not None else _load_nvml()
    if module is None:
        raise GpuDiscoveryError("NVML bindings (nvidia-ml-py) are not installed; pass --gpus N")
    try:
        inventory = query_nvml(module)
    except module.NVMLError as e:
        raise GpuDiscoveryError(
            f"NVML could not list GPUs ({type(e).__name__}: {e}); "
            "pass --gpus N to declare how many this node has"
        ) from e
    log.info(
        "GPUs found with NVML",
        count=inventory.count,
        models=sorted({d.model for d in inventory.devices}),
        uuids=list(inventory.uuids),
    )
    return inventory
