"""Benchmark: one full scheduling cycle (`policy.cycle.decide`) on a large cluster.

Base size: 1,000 nodes x 8 GPUs in one pool, 50 projects (quotas summing to about the cluster,
over-quota weights 1-3, a few project priorities), 5,000 running and 10,000 pending jobs: mostly
1-GPU jobs, some of 2, 4 and 8 GPUs, a few two-node gangs, a few elastic jobs, a tenth
non-preemptible (`build`); some running jobs inside their `min_runtime`, some pending jobs inside
their `preemption_delay`. Then the same at 2x and 4x (nodes, running and pending all scaled,
the jobs' shapes and classes dealt in the same proportions at every size: `Deck`).
`--scales 10` is the largest size the policy is sized for: 10,000 nodes x 8 GPUs, 50,000
running and 100,000 pending jobs (its goals: settled under 500 ms, burst under 2 s).

The state is built once by folding events into a `ClusterState` (the running jobs' GPUs are
chosen here, packed but not by the policy), then `decide(state, now)` is timed repeatedly: it
is pure, so every run does the same work.

- `burst`: the cycle on the state as built (the queue is long, projects are off their shares,
  so the cycle places, preempts and reclaims: the heaviest cycle).
- `settled` (unless `--no-settled`): the cycle once its decisions, and those of the cycles
  after it, have been carried out by simulated executors: the common case, nothing to do.

`--restored` times each state restored from a snapshot of it, as a decision service has it
after a restart (every value decoded from bytes, as from the log); as built, values this file
makes once are shared by every job and replica that has them.

Figures are p50/p99 milliseconds (time.perf_counter) over `--runs` runs, and the growth of each
against the smallest scale; the p50 of the process's own CPU time a cycle (time.process_time)
and its growth, which what other processes take of a shared machine does not move; per state,
the seconds it took to build (a settled state's include settling it); memory, as tracemalloc
counts it (Python's allocations: what the process reuses from an earlier state's garbage counts
too, where its resident size would not grow): the most the build held at once and what the state
kept (a settled state's before settling, which is not traced), and the most one cycle (the
untimed warm-up) held at once above the state; and the process's resident peak over the whole
run (`--no-memory`: no tracing, which makes the builds four to five times slower). Every state
is built first and the cycles are timed in rounds, each state in turn, so a busy moment on a
shared machine falls on every size alike (the growth moved by 10% between runs when the sizes
were timed one after the other). Nothing is asserted about time: machines are shared and noisy.

Each figure carries its plan's fingerprint (sha256 of the decisions and the waiting reasons).
`--baseline REV` times the policy as it is at git revision REV (its files checked out into a
temporary folder) and as it is now, each in a child process of its own building the same
states with this file, and prints both, before over now, the growth of each, and whether every
plan is the same (exit status 1 if one is not): a speed-up must leave every decision as it was.

    uv run python -m bench.policy_cycle [--runs 30] [--scales 1,2,4,10] [--no-burst] [-o json]
        [--profile] [--baseline main]

The figures taken are in the README's "Figures".
"""

from __future__ import annotations

import cProfile
import gc
import hashlib
import io
import platform
import pstats
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Generic, Literal, TypeVar

import cyclopts
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.options import BadOption, Output, run_command
from bench.revision import ROOT, check_out, child_output
from bench.rss import peak_mib
from events import (
    ClusterConfigured,
    ClusterSettings,
    Event,
    JobAdmitted,
    JobCheckpointed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    SchedulerSettings,
)
from events.model import DEFAULT_PRIORITY_CLASSES, Fitting, SchedulerType, VictimOrder
from events.units import percentile
from policy.capacity import Capacity, NodeSlots
from policy.cycle import Plan, decide
from policy.snapshot import decode_snapshot, encode_snapshot
from policy.state import ClusterState
from simulation.virtual_cluster import VirtualCluster

GPUS_PER_NODE = 8
PROJECTS = 50
POOL = "default"
#: The moment the timed cycle runs at: long after the first jobs were submitted.
NOW = 100_000.0

CLASSES = {c.name: c for c in DEFAULT_PRIORITY_CLASSES}


@dataclass(frozen=True)
class Size:
    """A cluster size: nodes (of 8 GPUs), running and pending jobs."""

    nodes: int
    running: int
    pending: int

    def times(self, scale: int) -> Size:
        return Size(self.nodes * scale, self.running * scale, self.pending * scale)


BASE = Size(nodes=1_000, running=5_000, pending=10_000)


@dataclass
class Figures:
    scale: int
    cycle: str  # "burst" (the state as built) or "settled"
    nodes: int
    running: int
    pending: int
    decisions: int
    runs: int
    p50_ms: float
    p99_ms: float
    growth_p50: float = 1.0
    growth_p99: float = 1.0
    #: the p50 of the process's CPU time a cycle (time.process_time), and its growth: what
    #: other processes on a shared machine take of the processor does not count in it
    cpu_p50_ms: float = 0.0
    cpu_growth_p50: float = 1.0
    #: the plan's fingerprint (`plan_sha256`): the same before and after a change that is
    #: meant to leave every decision as it was
    plan_sha256: str = ""
    #: seconds to build the state (a settled state's include settling it)
    build_s: float = 0.0
    #: MiB (tracemalloc): the most the build held at once, what the state kept (settled: as
    #: built, before settling), and the most one cycle held at once above the state
    build_peak_mib: float | None = None
    state_mib: float | None = None
    cycle_peak_mib: float | None = None


@dataclass(frozen=True)
class Shape:
    gpus: int
    replicas: int
    min_replicas: int


T = TypeVar("T")

#: The running and pending jobs' shapes, in the proportions they are dealt in (`Deck`): mostly
#: 1-GPU jobs, some of 2, 4 and 8 GPUs, a few two-node gangs and elastic jobs (1 to 4
#: replicas); about 1.5 GPUs a job, so 5,000 running jobs fill ~95% of 8,000 GPUs
SHAPES: tuple[tuple[Shape, int], ...] = (
    (Shape(1, 1, 1), 164),
    (Shape(2, 1, 1), 18),
    (Shape(4, 1, 1), 10),
    (Shape(8, 1, 1), 5),
    (Shape(8, 2, 2), 1),
    (Shape(1, 4, 1), 1),
    (Shape(2, 4, 1), 1),
)
#: The jobs' priority classes, in the proportions they are dealt in
CLASS_MIX: tuple[tuple[str, int], ...] = (("build", 2), ("interactive", 5), ("train", 13))


class Deck(Generic[T]):
    """Draws in fixed proportions: each round deals every value its count of times, in an
    order shuffled by the bench's generator, so every round's worth of jobs has the same mix
    (200 jobs of `SHAPES`, 20 of `CLASS_MIX`; the sizes are multiples of 200).

    Drawn one by one, the running jobs' GPUs varied by a few percent between sizes, and what
    they leave idle (a difference of two large numbers) by far more: the default seed's 4x
    cluster had 3.1 times the idle GPUs of its 1x, and so a larger share of its queue to
    preempt for (4.7 times the victims, 2.9 times the placements); other seeds' had 2.9 to
    6.9 times. The growth from 1x to 4x measured the draw as much as the policy. Dealt, the
    4x cluster leaves 3.85 to 4.09 times the 1x's GPUs idle (seeds 1 to 7)."""

    def __init__(self, rng: random.Random, counts: tuple[tuple[T, int], ...]) -> None:
        self._rng = rng
        self._round = [value for value, count in counts for _ in range(count)]
        self._left: list[T] = []

    def draw(self) -> T:
        if not self._left:
            self._left = list(self._round)
            self._rng.shuffle(self._left)
        return self._left.pop()


@dataclass
class Built:
    state: ClusterState
    events: int
    build_s: float


#: Events folded between two calls of `build`'s `tick`
TICK_EVERY = 20_000


def build(  # noqa: PLR0915 (one cluster described event by event, top to bottom)
    size: Size,
    seed: int = 7,
    scheduler: SchedulerType = "fair_share",
    fitting: Fitting = "best",
    victim_order: VictimOrder = "newest",
    tick: Callable[[int, int], None] = lambda done, total: None,
) -> Built:
    """A cluster of this size, as a folded event log; `tick(folded, total)` now and then while
    folding (a progress bar's: 10x folds 430,000 events)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    n_nodes = size.nodes
    total = n_nodes * GPUS_PER_NODE
    events: list[tuple[float, int, Event]] = []
    order = 0

    def emit(event: Event) -> None:
        nonlocal order
        events.append((event.time, order, event))
        order += 1

    settings = SchedulerSettings(type=scheduler, fitting=fitting, victim_order=victim_order)
    emit(
        ClusterConfigured(
            id="cluster", time=0.0, actor="bench", settings=ClusterSettings(scheduler=settings)
        )
    )
    emit(PoolConfigured(id="pool", time=0.0, actor="bench", pool=POOL))
    for i in range(n_nodes):
        node = f"node-{i:05d}"
        emit(
            NodeRegistered(
                id=f"reg-{node}", time=0.0, actor="bench", node=node, pool=POOL, gpus=GPUS_PER_NODE
            )
        )

    # Projects: quotas in proportion to a size, summing to about the cluster; popularity (how
    # much work a project runs and queues) differs from its quota, so some are over it.
    names = [f"project-{i:02d}" for i in range(PROJECTS)]
    sizes = [rng.choice((1, 1, 2, 3, 5, 8)) for _ in names]
    quotas = [total * s // sum(sizes) for s in sizes]
    popularity = [s * rng.uniform(0.3, 2.5) for s in sizes]
    limits: dict[str, int] = {}
    for name, quota in zip(names, quotas, strict=True):
        terms = ProjectTerms(
            quota=quota,
            over_quota_weight=rng.randint(1, 3),
            limit=None if rng.random() < 0.8 else max(8, quota * 2),
            priority=rng.choice((100, 100, 100, 100, 150)),
        )
        limits[name] = total if terms.limit is None else terms.limit
        emit(
            ProjectConfigured(
                id=f"cfg-{name}", time=0.0, actor="bench", project=name, terms={POOL: terms}
            )
        )

    # Running jobs, packed (best fit) by the bench itself; a job that no longer fits is drawn
    # again as a 1-GPU job, so the count is exact.
    capacity = Capacity(
        [
            NodeSlots(f"node-{i:05d}", i, i, GPUS_PER_NODE, list(range(GPUS_PER_NODE)))
            for i in range(n_nodes)
        ]
    )
    shapes, classes = Deck(rng, SHAPES), Deck(rng, CLASS_MIX)
    np_used = dict.fromkeys(names, 0)
    used = dict.fromkeys(names, 0)
    for job in range(size.running):
        shape = shapes.draw()
        count = rng.randint(shape.min_replicas, shape.replicas)
        placed = capacity.place(shape.gpus, count, "best")
        if placed is None:
            shape, count = Shape(1, 1, 1), 1
            placed = capacity.place(1, 1, "best")
        if placed is None:
            break  # the cluster is full
        project = rng.choices(names, popularity)[0]
        while used[project] + shape.gpus * count > limits[project]:
            project = rng.choice(names)  # limits hold for running work
        cls = classes.draw()
        gpus = shape.gpus * count
        if cls == "build" and np_used[project] + gpus > quotas[names.index(project)]:
            cls = "train"  # non-preemptible work runs within quota
        np_used[project] += gpus if cls == "build" else 0
        used[project] += gpus
        submitted = rng.uniform(0, NOW - 3_600)
        start = submitted + rng.uniform(0, 600)
        job_id = f"run-{job}"
        min_runtime = 1_800.0 if rng.random() < 0.2 else 0.0
        _job_events(emit, job_id, project, cls, shape, submitted, min_runtime, 0.0)
        emit(
            JobScheduled(
                id=f"{job_id}/1/scheduled",
                time=start,
                actor="bench",
                job_id=job_id,
                attempt=1,
                pool=POOL,
                replicas=tuple(placed),
            )
        )
        start += rng.uniform(0, 60) if rng.random() < 0.95 else NOW  # a few still starting
        if start < NOW:
            emit(
                JobStarted(
                    id=f"{job_id}/1/started", time=start, actor="bench", job_id=job_id, attempt=1
                )
            )
            if rng.random() < 0.5:
                at = rng.uniform(start, NOW)
                emit(
                    JobCheckpointed(
                        id=f"{job_id}/1/ckpt",
                        time=at,
                        actor="bench",
                        job_id=job_id,
                        attempt=1,
                        save_s=rng.uniform(5, 60),
                    )
                )

    # Pending work is skewed: a few projects want far more than their share.
    for i in range(size.pending):
        project = names[int(rng.paretovariate(1.2)) % PROJECTS]
        shape = shapes.draw()
        if shape.gpus * shape.min_replicas > limits[project]:
            shape = Shape(1, 1, 1)
        submitted = rng.uniform(NOW - 20_000, NOW - 1)
        delay = 600.0 if rng.random() < 0.2 else 0.0
        _job_events(emit, f"wait-{i}", project, classes.draw(), shape, submitted, 0.0, delay)

    events.sort(key=lambda t: (t[0], t[1]))
    state = _fold([event for _, _, event in events], tick)
    return Built(state, len(events), time.perf_counter() - started)


def _fold(events: list[Event], tick: Callable[[int, int], None]) -> ClusterState:
    state = ClusterState()
    for folded, event in enumerate(events):
        if folded % TICK_EVERY == 0:
            tick(folded, len(events))
        state.apply(event)
    tick(len(events), len(events))
    return state


def _job_events(
    emit: Callable[[Event], None],
    job_id: str,
    project: str,
    cls: str,
    shape: Shape,
    submitted: float,
    min_runtime: float,
    delay: float,
) -> None:
    klass = CLASSES[cls]
    elastic = shape.min_replicas < shape.replicas
    spec = JobSpec(
        project=project,
        priority_class=cls,
        gpus=shape.gpus,
        replicas=shape.replicas,
        min_replicas=shape.min_replicas if elastic else None,
        min_runtime_s=min_runtime,
        preemption_delay_s=delay,
    )
    emit(
        JobSubmitted(id=f"{job_id}/submit", time=submitted, actor="bench", job_id=job_id, spec=spec)
    )
    emit(
        JobAdmitted(
            id=f"{job_id}/admission",
            time=submitted,
            actor="bench",
            job_id=job_id,
            project=project,
            priority=klass.priority,
            preemptible=klass.preemptible,
            gpus=shape.gpus,
            replicas=shape.replicas,
            min_replicas=shape.min_replicas,
            pools=(POOL,),
            min_runtime_s=min_runtime,
            preemption_delay_s=delay,
        )
    )


# -- timing ------------------------------------------------------------------------------------


GcMode = Literal["on", "freeze", "off"]


@dataclass
class _Timed:
    """One state to time a cycle on, and its samples (milliseconds)."""

    scale: int
    cycle: str
    state: ClusterState
    built: Traced
    decisions: int = 0
    plan_sha256: str = ""
    samples: list[float] = field(default_factory=list)
    cpu_samples: list[float] = field(default_factory=list)  # the process's CPU time
    cycle_peak_mib: float | None = None


def measure(
    scales: list[int],
    runs: int,
    *,
    base: Size | None = None,
    seed: int = 7,
    settled: bool = True,
    burst: bool = True,
    scheduler: SchedulerType = "fair_share",
    fitting: Fitting = "best",
    victim_order: VictimOrder = "newest",
    gc_mode: GcMode = "on",
    memory: bool = True,
    restored: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    tick: Callable[[int, int], None] = lambda done, total: None,
) -> list[Figures]:
    """Build every scale's states first, then time their cycles in rounds, each state in turn
    (an untimed cycle first, so its state is in cache as back-to-back cycles have it, then
    `ROUND` timed ones). A machine shared with others slows down and speeds up over a run:
    timed one scale after the other, the growth between scales moved by 10% from one run to
    the next; in rounds, every scale sees the same moments."""
    timed: list[_Timed] = []
    settings = (scheduler, fitting, victim_order)
    for scale in scales:
        size = (base or BASE).times(scale)
        if burst:
            progress(f"building {scale}x (burst)")
            with Traced(memory) as built:
                state = build(size, seed, *settings, tick=tick).state
            timed.append(_Timed(scale, "burst", _restored(state) if restored else state, built))
        if settled:  # built again (not copied: a copy lays the objects out anew in memory)
            progress(f"building {scale}x (settled)")
            with Traced(memory) as built:
                state = build(size, seed, *settings, tick=tick).state
            progress(f"settling {scale}x: carrying out the burst's decisions")
            started = time.perf_counter()  # untraced: tracing would slow it down fivefold
            vc = VirtualCluster(state=state, now=NOW)
            vc.settle()  # the burst's decisions, and the cycles after it, until quiet
            built.seconds += time.perf_counter() - started
            state = _restored(vc.state) if restored else vc.state
            timed.append(_Timed(scale, "settled", state, built))
    for t in timed:
        progress(f"warm-up cycle, {t.scale}x {t.cycle}")
        # warm-up, the size of the answer, and the memory a cycle takes
        t.decisions, t.plan_sha256, t.cycle_peak_mib = _traced_cycle(t.state, memory)
    gc.collect()
    if gc_mode == "freeze":
        gc.freeze()  # what a long-running service may do once it has replayed the log
    elif gc_mode == "off":
        gc.disable()
    try:
        done = 0
        while done < runs:
            count = min(ROUND, runs - done)
            progress(f"timing: {done} of {runs} cycles of each ...")
            for t in timed:
                decide(t.state, NOW)
                for _ in range(count):
                    start, cpu = time.perf_counter(), time.process_time()
                    decide(t.state, NOW)
                    t.cpu_samples.append((time.process_time() - cpu) * 1000)
                    t.samples.append((time.perf_counter() - start) * 1000)
            done += count
    finally:
        gc.enable()
        gc.unfreeze()
    return [_figures(t) for t in timed]


def _restored(state: ClusterState) -> ClusterState:
    """The state as a service restarting from a snapshot of it has it: decoded, every
    replica's node name and GPU list, and every job's values, come from bytes, as they do
    from the log (built here, they are the objects this file made them with)."""
    return decode_snapshot(encode_snapshot(state, state.position))[0]


class Traced:
    """How long a phase took and, if `memory`, what it allocated as tracemalloc counts it:
    `with Traced() as t: ...`, then `t.seconds` (tracing included: it slows allocation down
    four- to fivefold), `t.peak_mib` (the most it held at once) and `t.kept_mib` (what it
    still holds at the end); None when not traced."""

    def __init__(self, memory: bool = True) -> None:
        self.memory = memory
        self.seconds = 0.0
        self.peak_mib: float | None = None
        self.kept_mib: float | None = None
        self._started = 0.0

    def __enter__(self) -> Traced:
        gc.collect()  # the garbage from before is not this phase's
        if self.memory:
            tracemalloc.start()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.perf_counter() - self._started
        if self.memory:
            gc.collect()
            kept, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            self.peak_mib, self.kept_mib = round(peak / (1 << 20), 1), round(kept / (1 << 20), 1)


def _traced_cycle(state: ClusterState, memory: bool) -> tuple[int, str, float | None]:
    """One cycle's decisions, its plan's fingerprint, and the most it held at once above the
    state (MiB)."""
    with Traced(memory) as cycle:
        plan = decide(state, NOW)
    return len(plan), plan_sha256(plan), cycle.peak_mib


#: Timed cycles of one state in a row, within a round of `measure`
ROUND = 5


def _figures(t: _Timed) -> Figures:
    phases = [j.phase for j in t.state.live.values()]
    return Figures(
        scale=t.scale,
        cycle=t.cycle,
        nodes=len(t.state.nodes),
        running=sum(p in ("starting", "running") for p in phases),
        pending=phases.count("pending"),
        decisions=t.decisions,
        runs=len(t.samples),
        p50_ms=round(percentile(t.samples, 0.50), 2),
        p99_ms=round(percentile(t.samples, 0.99), 2),
        cpu_p50_ms=round(percentile(t.cpu_samples, 0.50), 2),
        plan_sha256=t.plan_sha256,
        build_s=round(t.built.seconds, 4),
        build_peak_mib=t.built.peak_mib,
        state_mib=t.built.kept_mib,
        cycle_peak_mib=t.cycle_peak_mib,
    )


def plan_sha256(plan: Plan) -> str:
    """A fingerprint of everything a plan decides: its events and why each job waits."""
    digest = hashlib.sha256(msgspec.json.encode(plan.events))
    digest.update(msgspec.json.encode(sorted(plan.waiting.items())))
    return digest.hexdigest()


def with_growth(results: list[Figures]) -> list[Figures]:
    """Each row's p50/p99 against the smallest scale of the same cycle kind."""
    for f in results:
        base = min((r for r in results if r.cycle == f.cycle), key=lambda r: r.scale)
        f.growth_p50 = round(f.p50_ms / base.p50_ms, 2) if base.p50_ms else 0.0
        f.growth_p99 = round(f.p99_ms / base.p99_ms, 2) if base.p99_ms else 0.0
        f.cpu_growth_p50 = round(f.cpu_p50_ms / base.cpu_p50_ms, 2) if base.cpu_p50_ms else 0.0
    return results


def profile(scale: int, runs: int, seed: int, top: int) -> str:
    """cProfile of `runs` burst cycles at `scale`: the hot spots, by own time."""
    state = build(BASE.times(scale), seed).state
    decide(state, NOW)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        decide(state, NOW)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- against a baseline ----------------------------------------------------------------------


@dataclass
class Paired:
    """One state's cycle timed before (at the baseline revision) and after (this tree)."""

    scale: int
    cycle: str
    decisions: int
    before: Figures
    after: Figures
    #: before over after, p50 (above 1: faster now)
    speedup_p50: float
    #: every decision the same: the plans' fingerprints are equal
    same_plan: bool


def against(
    revision: str,
    scales: list[int],
    runs: int,
    options: Mapping[str, object],
    base: Size | None = None,
) -> list[Paired]:
    """Time the cycles as `measure` does twice, each in a child process of its own: with the
    policy at git `revision` (checked out into a temporary folder), then with this tree's.
    Both children build the states with this file's `build`, so they decide on the same
    states; each plan's fingerprint says whether they decided the same. `options` are
    `measure`'s (seed, settled, burst, scheduler, fitting, victim_order, gc_mode)."""
    asked = {"scales": scales, "runs": runs, **options}
    if base is not None:
        asked["base"] = (base.nodes, base.running, base.pending)
    request = msgspec.json.encode(asked).decode()
    with tempfile.TemporaryDirectory(prefix="policy-cycle-") as tmp:
        check_out(revision, Path(tmp))
        before = _child_figures(Path(tmp), request)
    after = _child_figures(ROOT, request)
    with_growth(before)
    with_growth(after)
    paired = []
    for old, new in zip(before, after, strict=True):
        paired.append(
            Paired(
                scale=new.scale,
                cycle=new.cycle,
                decisions=new.decisions,
                before=old,
                after=new,
                speedup_p50=round(old.p50_ms / new.p50_ms, 2) if new.p50_ms else 0.0,
                same_plan=old.plan_sha256 == new.plan_sha256,
            )
        )
    return paired


def _child_figures(tree: Path, request: str) -> list[Figures]:
    """`measure`'s figures from a child process deciding with the policy of `tree`."""
    reply = msgspec.json.decode(child_output(tree, Path(__file__), request, "the cycle timed"))
    if Path(reply["policy"]) != tree.resolve() / "policy":
        raise RuntimeError(f"the child decided with {reply['policy']}, not {tree}'s policy")
    return [msgspec.convert(f, Figures) for f in reply["figures"]]


def child(request: str) -> None:
    """In a child of `against`: `measure` as asked, its figures written as JSON, with where
    the policy that decided came from."""
    import policy  # noqa: PLC0415 (only to say where it was imported from)

    asked = msgspec.json.decode(request)
    base = asked.pop("base", None)
    figures = measure(base=None if base is None else Size(*base), **asked)
    reply = {"policy": str(Path(policy.__file__).resolve().parent), "figures": figures}
    sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")


def main_against(
    revision: str, scales: list[int], runs: int, options: Mapping[str, object], output: str
) -> int:
    """`--baseline`: the figures before and now, printed; 1 if a plan differs."""
    with Console(stderr=True).status(f"timing the policy at {revision}, then now ..."):
        paired = against(revision, scales, runs, options)
    if output == "json":
        sys.stdout.write(msgspec.json.encode(paired).decode() + "\n")
    else:
        print_against(revision, paired)
    if all(p.same_plan for p in paired):
        return 0
    Console(stderr=True).print("[red]the plans differ: the change is not decision-neutral[/red]")
    return 1


def print_against(revision: str, paired: list[Paired]) -> None:
    """Before and after side by side, and whether every plan is the same."""
    table = Table(title=f"One full scheduling cycle: policy at {revision} (before) and now")
    columns = ("scale", "cycle", "decisions", "before p50", "now p50", "before/now")
    growths = ("growth before", "growth now", "CPU growth before", "CPU growth now")
    for column in (*columns, *growths, "plan sha256", "same plan"):
        table.add_column(column, justify="right")
    for p in sorted(paired, key=lambda p: (p.cycle, p.scale)):
        table.add_row(
            f"{p.scale}x",
            p.cycle,
            f"{p.decisions:,}",
            f"{p.before.p50_ms:.1f}",
            f"{p.after.p50_ms:.1f}",
            f"{p.speedup_p50:.2f}",
            f"{p.before.growth_p50:.2f}",
            f"{p.after.growth_p50:.2f}",
            f"{p.before.cpu_growth_p50:.2f}",
            f"{p.after.cpu_growth_p50:.2f}",
            p.after.plan_sha256[:12],
            "yes" if p.same_plan else f"NO (before {p.before.plan_sha256[:12]})",
        )
    Console(width=None if sys.stdout.isatty() else 180).print(table)


# -- command line ------------------------------------------------------------------------------

app = cyclopts.App(help=__doc__)


@app.default
def main(
    *,
    runs: int = 30,
    scales: str = "1,2,4",
    seed: int = 7,
    settled: bool = True,
    burst: bool = True,
    scheduler: SchedulerType = "fair_share",
    fitting: Fitting = "best",
    victim_order: VictimOrder = "newest",
    gc_mode: Annotated[GcMode, cyclopts.Parameter(name="--gc")] = "on",
    memory: bool = True,
    restored: bool = False,
    profile_top: Annotated[int, cyclopts.Parameter(name="--profile")] = 0,
    baseline: str | None = None,
    output: Output = "text",
) -> None:
    """Time one scheduling cycle at several cluster sizes.

    Parameters
    ----------
    runs
        Timed cycles per size and kind (after one warm-up).
    scales
        Comma-separated multiples of the base size (1,000 nodes, 5,000 running, 10,000 pending).
    seed
        Seed of the random cluster.
    settled
        Also time the cycle once the burst's decisions have been carried out.
    burst
        Time the cycle on the state as built (--no-burst: only the settled cycle).
    scheduler
        The pool's scheduler.
    fitting
        best (pack) or worst (spread).
    victim_order
        newest or cost.
    gc_mode
        Python's garbage collector while timing: on (as it comes), freeze (gc.freeze() after
        building, as a long-running service may after replaying the log), or off. A cycle
        pauses the collector while it runs (policy/collector.py): the mode decides what the
        collections due after each cycle walk.
    memory
        Measure the memory of each build and of one cycle (tracemalloc, which makes the builds
        four to five times slower: --no-memory for their true time).
    restored
        Time each state restored from a snapshot of it, as a decision service has it after a
        restart (its values decoded from bytes, as from the log), rather than as built.
    profile_top
        Instead of timing, profile the burst cycle at the first scale and print this many
        functions by own time.
    baseline
        A git revision (e.g. main): time the policy as it was there and as it is now, each in
        a child process, on the same states, and check that every plan is the same (exit
        status 1 if one is not).
    output
        text (a table) or json.
    """
    console = Console(stderr=True)
    sizes = parse_scales(scales)
    if profile_top:
        sys.stdout.write(profile(sizes[0], runs, seed, profile_top))
        return
    if baseline is not None:
        options = {
            "seed": seed,
            "settled": settled,
            "burst": burst,
            "scheduler": scheduler,
            "fitting": fitting,
            "victim_order": victim_order,
            "gc_mode": gc_mode,
            "restored": restored,
        }
        sys.exit(main_against(baseline, sizes, runs, options, output))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("building", total=None)
        results = measure(
            sizes,
            runs,
            seed=seed,
            settled=settled,
            burst=burst,
            scheduler=scheduler,
            fitting=fitting,
            victim_order=victim_order,
            gc_mode=gc_mode,
            memory=memory,
            restored=restored,
            progress=lambda text: bar.update(task, description=text, total=None, completed=0),
            tick=lambda done, total: bar.update(task, completed=done, total=total),
        )
    with_growth(results)
    if output == "json":
        doc = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "scheduler": scheduler,
            "fitting": fitting,
            "victim_order": victim_order,
            "gc": gc_mode,
            "memory": memory,
            "restored": restored,
            "seed": seed,
            "peak_rss_mib": peak_mib(),
            "results": [asdict(f) for f in results],
        }
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return
    title = f"One full scheduling cycle ({scheduler}, {fitting} fit, {victim_order}, gc {gc_mode})"
    table = Table(title=title)
    names = ["scale", "cycle", "nodes", "running", "pending", "decisions", "p50 ms", "p99 ms"]
    names += ["p50 growth", "p99 growth", "CPU p50 ms", "CPU growth"]
    names += ["build s", "build peak MiB", "state MiB"]
    for name in (*names, "cycle peak MiB"):
        table.add_column(name, justify="right")
    for f in sorted(results, key=lambda f: (f.cycle, f.scale)):
        table.add_row(
            f"{f.scale}x",
            f.cycle,
            f"{f.nodes:,}",
            f"{f.running:,}",
            f"{f.pending:,}",
            f"{f.decisions:,}",
            f"{f.p50_ms:.1f}",
            f"{f.p99_ms:.1f}",
            f"{f.growth_p50:.2f}",
            f"{f.growth_p99:.2f}",
            f"{f.cpu_p50_ms:.1f}",
            f"{f.cpu_growth_p50:.2f}",
            f"{f.build_s:.1f}",
            _mib(f.build_peak_mib),
            _mib(f.state_mib),
            _mib(f.cycle_peak_mib),
        )
    out = Console(width=None if sys.stdout.isatty() else 200)
    out.print(table)
    peak = peak_mib()
    out.print(f"the process's resident peak: {'-' if peak is None else f'{peak:,.0f}'} MiB")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def parse_scales(text: str) -> list[int]:
    """'1,2,4,10' -> [1, 2, 4, 10]: whole multiples of the base size, 1 to 100."""
    scales = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            if not part.isdigit() or not 1 <= int(part) <= MAX_SCALE:
                raise BadOption(f"--scales: {part!r} is not a whole number from 1 to {MAX_SCALE}")
            scales.append(int(part))
    if not scales:
        raise BadOption(f"--scales: {text!r} names no scale")
    return scales


#: The largest multiple of the base size a run may build (100x: 100,000 nodes, ~30 GiB)
MAX_SCALE = 100


if __name__ == "__main__":
    run_command(app)
