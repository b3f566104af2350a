"""Sampling this node's GPUs through NVML, at a bounded rate, into the GPU samples bucket.

The imperative shell (`sample_gpus`, one task per executor) reads NVML in a worker thread
every `gpu_sample_s` and puts the node's value (services/runtime/gpu_samples.py). `read_gpus`
asks NVML a field at a time (a board without a power sensor still reports its utilization);
`UsageTracker`, pure, folds the samples into each job's utilization, its average over the
attempt, and since when its GPUs have all been at 0%.
The average is what the executor puts on the event that ends the attempt
(`attempt_utilization`), so the job's timeline keeps it after the samples are gone.

Where NVML cannot be read (no driver: `--gpus N` declared), every GPU is sent with its fields
None ("unknown"), and no job is ever called idle: idleness needs a 0% that was seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from services.executor.facts import AttemptKey
from services.executor.gpus import _load_nvml, _text
from services.runtime.gpu_samples import GpuSample, GpuSamples, JobGpuUsage, NodeSamples

if TYPE_CHECKING:
    from services.executor.config import ExecutorConfig


def _field(nvml: ModuleType, read: Callable[[], Any]) -> Any:
    """One NVML answer, or None where the board or driver cannot give it."""
    try:
        return read()
    except nvml.NVMLError:
        return None


def read_gpu(nvml: ModuleType, index: int) -> GpuSample:
    """One GPU's sample; raises `nvml.NVMLError` only if the GPU itself cannot be found."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _field(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    utilization = _field(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    power_mw = _field(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    temperature = _field(
        nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    )
    return GpuSample(
        index=index,
        uuid=_text(_field(nvml, lambda: nvml.nvmlDeviceGetUUID(handle)) or ""),
        model=_text(_field(nvml, lambda: nvml.nvmlDeviceGetName(handle)) or ""),
        utilization=float(utilization.gpu) if utilization is not None else None,
        memory_used_mb=int(memory.used) >> 20 if memory is not None else None,
        memory_total_mb=int(memory.total) >> 20 if memory is not None else None,
        temperature_c=int(temperature) if temperature is not None else None,
        power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
    )


def read_gpus(nvml: ModuleType | None, count: int) -> tuple[GpuSample, ...]:
    """The node's `count` GPUs (those it offers); unknown ones where NVML has no such index."""
    found: list[GpuSample] = []
    for index in range(count):
        sample = GpuSample(index=index)
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                sample = read_gpu(nvml, index)
        found.append(sample)
    return tuple(found)


@dataclass(slots=True)
class _Attempt:
    total: float = 0.0
    samples: int = 0
    zero_since: float | None = None


class UsageTracker:
    """Each attempt's utilization over the samples taken while it held GPUs here."""

    def __init__(self, idle_after_s: float) -> None:
        self.idle_after_s = idle_after_s
        self._attempts: dict[AttemptKey, _Attempt] = {}
        #: how often an average may have moved (a sample folded, an attempt dropped)
        self.changes = 0

    def observe(
        self, now: float, gpus: tuple[GpuSample, ...], held: Mapping[AttemptKey, tuple[int, ...]]
    ) -> tuple[tuple[GpuSample, ...], tuple[JobGpuUsage, ...]]:
        """Fold one sample: `held` is each running attempt's GPU indexes on this node. Returns
        the GPUs marked with the job holding each, and each attempt's usage."""
        self.changes += 1
        by_index = {g.index: g for g in gpus}
        owner = {i: key[0] for key, indexes in held.items() for i in indexes}
        marked = tuple(msgspec.structs.replace(g, job_id=owner.get(g.index)) for g in gpus)
        usages: list[JobGpuUsage] = []
        for key, indexes in sorted(held.items()):
            state = self._attempts.setdefault(key, _Attempt())
            values = [by_index[i].utilization for i in indexes if i in by_index]
            known = [v for v in values if v is not None]
            now_value = sum(known) / len(known) if known and len(known) == len(indexes) else None
            if now_value is not None:
                state.total += now_value
                state.samples += 1
                if now_value == 0.0:
                    state.zero_since = state.zero_since if state.zero_since is not None else now
                else:
                    state.zero_since = None
            else:
                state.zero_since = None  # unknown is not idle
            usages.append(
                JobGpuUsage(
                    job_id=key[0],
                    attempt=key[1],
                    gpus=tuple(indexes),
                    utilization=now_value,
                    average=self.average(key),
                    samples=state.samples,
                    zero_since=state.zero_since,
                    idle=state.zero_since is not None
                    and now - state.zero_since >= self.idle_after_s,
                )
            )
        return marked, tuple(usages)

    def average(self, key: AttemptKey) -> float | None:
        state = self._attempts.get(key)
        if state is None or state.samples == 0:
            return None
        return round(state.total / state.samples, 1)

    def forget(self, keep: set[AttemptKey]) -> None:
        """Drop attempts that are over here (their end event has been published)."""
        for key in [k for k in self._attempts if k not in keep]:
            del self._attempts[key]
            self.changes += 1


def open_nvml() -> tuple[ModuleType | None, str]:
    """NVML initialised for sampling, or None and why not."""
    nvml = _load_nvml()
    if nvml is None:
        return None, "the NVML bindings are not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return None, f"{type(e).__name__}: {e}"
    return nvml, ""


async def sample_gpus(
    config: ExecutorConfig,
    store: GpuSamples,
    tracker: UsageTracker,
    held: Callable[[], dict[AttemptKey, tuple[int, ...]]],
    attempts: Callable[[], set[AttemptKey]],
) -> None:
    """Put this node's samples in the host's `store` every `gpu_sample_s`, until cancelled. `held`:
    the GPU indexes of each attempt with a replica running here; `attempts`: those known."""
    every = config.gpu_sample_s
    if every is None or config.hollow:
        return
    logger = structlog.get_logger("fairlane.executor").bind(node=config.node)
    nvml, error = await asyncio.to_thread(open_nvml)
    if nvml is None:
        logger.info("GPU samples will say unknown: NVML is not readable", error=error)
    try:
        while True:
            gpus = await asyncio.to_thread(read_gpus, nvml, config.gpus)
            now = time.time()
            marked, jobs = tracker.observe(now, gpus, held())
            value = NodeSamples(
                node=config.node,
                time=now,
                source="nvml" if nvml is not None else "unknown",
                every_s=every,
                idle_after_s=tracker.idle_after_s,
                gpus=marked,
                jobs=jobs,
                error=error,
            )
            try:
                await store.put(value)
            except Exception as e:  # the server away, the bucket not made yet: next time
                logger.warning("GPU samples not sent", error=str(e) or repr(e))
            tracker.forget(attempts())
            await asyncio.sleep(every)
    finally:
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
