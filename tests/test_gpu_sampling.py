"""GPU sampling, its pure part: NVML's answers read through the real pynvml from a fake
`libnvidia-ml.so.1` (tests/fake_nvml.py), each job's utilization, average and idle flag
folded from the samples, and the API's report joining them with the nodes' read model, where
whatever is not known says None, never 0."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from services.api.gpus import families, merge_jobs, report
from services.api.types import Node
from services.executor.sampling import UsageTracker, open_nvml, read_gpus
from services.runtime.gpu_samples import GpuSample, JobGpuUsage, NodeSamples
from tests.fake_nvml import FakeNvml, Gpu


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeNvml]:
    nvml = FakeNvml(tmp_path_factory.mktemp("nvml"))
    nvml.load_here()
    yield nvml


def test_nvml_readings_through_pynvml(fake: FakeNvml) -> None:
    fake.set([
        Gpu("GPU-0", utilization=37, memory_used_mib=1024, temperature_c=41, power_mw=123456),
        Gpu("GPU-1", utilization=None, memory_used_mib=None, temperature_c=None, power_mw=None),
    ])  # fmt: skip
    nvml, error = open_nvml()
    assert nvml is not None, error
    assert nvml is pynvml and error == ""
    try:
        first, second, third = read_gpus(nvml, 3)
    finally:
        pynvml.nvmlShutdown()
    assert first == GpuSample(
        index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", utilization=37.0,
        memory_used_mb=1024, memory_total_mb=81559, temperature_c=41, power_w=123.5,
    )  # fmt: skip
    # a board without those sensors: unknown, not 0 (its memory total is still read)
    assert (second.utilization, second.memory_used_mb, second.temperature_c) == (None,) * 3
    assert second.power_w is None and second.uuid == "GPU-1"
    # the node offers a third GPU that NVML does not have: every reading unknown
    assert third == GpuSample(index=2)


def test_without_a_driver_every_reading_is_unknown(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")  # nvmlInit fails as without a driver
    nvml, error = open_nvml()
    assert nvml is None and "NVMLError" in error
    samples = read_gpus(nvml, 2)
    assert samples == (GpuSample(index=0), GpuSample(index=1))
    tracker = UsageTracker(idle_after_s=0.0)
    _, (usage,) = tracker.observe(100.0, samples, {("j", 1): (0, 1)})
    # nothing seen, so nothing idle and no average
    assert (usage.utilization, usage.average, usage.idle, usage.samples) == (None, None, False, 0)


def gpus(*values: float | None) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(index=i, utilization=v) for i, v in enumerate(values))


def test_a_job_is_idle_once_its_gpus_were_all_at_zero_for_the_idle_time() -> None:
    tracker = UsageTracker(idle_after_s=10.0)
    held = {("train", 1): (0, 1), ("other", 1): (2,)}
    marked, (other, train) = tracker.observe(0.0, gpus(80, 40, 0), held)
    assert [g.job_id for g in marked] == ["train", "train", "other"]
    assert (train.utilization, train.average, train.idle) == (60.0, 60.0, False)
    assert other.zero_since == 0.0 and not other.idle
    _, (other, train) = tracker.observe(5.0, gpus(0, 0, 0), held)
    assert (train.utilization, train.average, train.zero_since) == (0.0, 30.0, 5.0)
    _, (other, train) = tracker.observe(10.0, gpus(0, 0, 0), held)
    assert other.idle and not train.idle  # other: 10 s at 0%; train: 5 s
    _, (other, train) = tracker.observe(15.0, gpus(0, 0, 0), held)
    assert train.idle and train.average == 15.0
    # one GPU busy again: no longer idle, and the count starts over
    _, (other, train) = tracker.observe(20.0, gpus(0, 5, 0), held)
    assert not train.idle and train.zero_since is None
    # an unknown reading is no 0%: not idle
    _, (other, train) = tracker.observe(40.0, gpus(0, 0, None), held)
    assert other.zero_since is None and not other.idle and other.utilization is None
    assert tracker.average(("train", 1)) == round((60 + 0 + 0 + 0 + 2.5 + 0) / 6, 1)
    tracker.forget({("train", 1)})
    assert tracker.average(("other", 1)) is None


def node(name: str, gpus: int) -> Node:
    return Node(node=name, pool="default", gpus=gpus, free=0, lost=False)


def usage(job: str, indexes: tuple[int, ...], now: float | None, idle: bool) -> JobGpuUsage:
    zero = 1.0 if idle else None
    return JobGpuUsage(job_id=job, attempt=1, gpus=indexes, utilization=now, average=now,
                       samples=1, zero_since=zero, idle=idle)  # fmt: skip


def test_report_joins_nodes_and_samples_and_hides_other_projects_jobs() -> None:
    a = NodeSamples(
        node="a", time=50.0, source="nvml", every_s=5.0, idle_after_s=60.0,
        gpus=(GpuSample(index=0, utilization=0.0, job_id="gang"),
              GpuSample(index=1, utilization=90.0, job_id="secret")),
        jobs=(usage("gang", (0,), 0.0, True), usage("secret", (1,), 90.0, False)),
    )  # fmt: skip
    b = NodeSamples(
        node="b", time=51.0, source="nvml", every_s=5.0, idle_after_s=60.0,
        gpus=(GpuSample(index=0, utilization=0.0, job_id="gang"),),
        jobs=(usage("gang", (0,), 0.0, True),),
    )  # fmt: skip
    projects = {"gang": "team-a", "secret": "team-b"}
    nodes = [node("a", 2), node("b", 1), node("c", 2)]
    seen = report(nodes, [a, b], projects, lambda p: p == "team-a")
    gang = seen.jobs[0]
    assert [j.job_id for j in seen.jobs] == ["gang"]  # team-b's job is not listed
    assert (gang.nodes, gang.gpus, gang.utilization, gang.idle) == (["a", "b"], 2, 0.0, True)
    first = seen.nodes[0].devices
    assert (first[0].job_id, first[0].idle) == ("gang", True)
    # held by a job the token may not read: held, its project named, the job not
    assert (first[1].job_id, first[1].project, first[1].held) == (None, "team-b", True)
    # node c has no samples: its GPUs are listed, every reading unknown
    c = seen.nodes[2]
    assert c.source == "unknown" and c.sampled_at is None
    assert [d.utilization for d in c.devices] == [None, None]
    # idle only where every node says so
    b_busy = NodeSamples(**{**{f: getattr(b, f) for f in b.__struct_fields__},
                            "jobs": (usage("gang", (0,), 50.0, False),)})  # fmt: skip
    (merged,) = merge_jobs([a, b_busy], projects, lambda p: p == "team-a")
    assert (merged.idle, merged.utilization) == (False, 25.0)


def test_metrics_leave_unknown_readings_out() -> None:
    a = NodeSamples(
        node="a", time=50.0, source="nvml", every_s=5.0, idle_after_s=60.0,
        gpus=(GpuSample(index=0, utilization=12.0, memory_used_mb=1, job_id="j"),),
        jobs=(usage("j", (0,), 12.0, False),),
    )  # fmt: skip
    r = report([node("a", 1), node("z", 1)], [a], {"j": "p"}, lambda _: True)
    by_name = {f.name: f.samples for f in families(r)}
    assert [(s.labels, s.value) for s in by_name["fairlane_gpu_utilization_percent"]] == [
        ({"node": "a", "gpu": "0"}, 12.0)
    ]  # node z's GPU is unknown: absent, not 0
    assert [s.labels["source"] for s in by_name["fairlane_gpu_info"]] == ["nvml", "unknown"]
    assert [s.value for s in by_name["fairlane_gpu_memory_used_bytes"]] == [float(1 << 20)]
    assert by_name["fairlane_gpu_temperature_celsius"] == []
    assert [s.value for s in by_name["fairlane_job_gpu_idle"]] == [0.0]
