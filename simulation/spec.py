"""Scenario files (scenarios/FORMAT.md), parsed strictly; the scenario engines run them and the
trace simulator reads its cluster files with the same parser.

YAML is read with YAML 1.2 rules (`on`, `no`, `yes` stay strings). The file is converted into
strict msgspec structs (`_File` and the structs below it: the file's shape, said once), so an
unknown key, a value of the wrong type or out of range is an error that names where it is and
what was there. Then what one part of the file says about another is checked (every job id a
step names was submitted before it, every node removed exists, names are unique), and the file
becomes the `Scenario` the engines run. Errors name the file, the step and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import msgspec
from msgspec.inspect import DictType, ListType, StructType, UnionType, VarTupleType
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from events import (
    CheckpointModel,
    JobSpec,
    PortMapping,
    PriorityClass,
    ProjectTerms,
    SchedulerSettings,
)
from events.commands import ConfigureCluster
from events.model import Fitting, SchedulerType, VictimOrder
from events.units import parse_duration
from policy.commands.names import NAME
from policy.decay import settings_problem


class ScenarioError(ValueError):
    """A scenario file that does not follow FORMAT.md."""


STEP_KINDS: Final = (
    "submit",
    "complete",
    "fail",
    "cancel",
    "pause",
    "resume",
    "set_project",
    "add_node",
    "remove_node",
    "cordon",
    "drain",
    "uncordon",
    "advance",
    "expect",
)
JOB_LIST_KINDS: Final = ("running", "pending", "paused", "completed", "failed", "cancelled")


# -- what the engines run ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeEntry:
    name: str
    gpus: int
    pool: str


@dataclass(frozen=True)
class PoolEntry:
    name: str
    scheduler: SchedulerSettings | None
    nodes: tuple[NodeEntry, ...]


@dataclass(frozen=True)
class ProjectEntry:
    """A project as written; None means 'not given' (set_project keeps the old value)."""

    name: str
    quota: dict[str | None, int] | None = None  # pool None: the default compute pool
    limit: dict[str | None, int] | None = None
    over_quota_weight: dict[str | None, int] | None = None
    priority: dict[str | None, int] | None = None


@dataclass(frozen=True)
class JobEntry:
    id: str
    spec: JobSpec


@dataclass(frozen=True)
class Expectation:
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)  # running, pending, ...
    rejected: dict[str, str | None] | None = None
    preempted: dict[str, int] | None = None
    replicas: dict[str, int] | None = None
    placed_on: dict[str, tuple[str, ...]] | None = None
    usage: dict[str, dict[str | None, int]] | None = None
    fair_share: dict[str, dict[str | None, int]] | None = None
    free: dict[str, int] | None = None
    stable: bool = False
    events: dict[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Step:
    number: int  # 1-based, as a person counts the steps of the file
    kind: str
    value: Any


@dataclass(frozen=True)
class Scenario:
    path: Path
    name: str
    description: str
    #: The cluster's settings, as the command that sets them; the default pools filled in.
    config: ConfigureCluster
    pools: tuple[PoolEntry, ...]
    projects: tuple[ProjectEntry, ...]
    steps: tuple[Step, ...]

    @property
    def needs_virtual_clock(self) -> str | None:
        """Why the scenario needs the virtual clock (it moves time, or simulates work), or None
        if it runs on the wall clock: the live engine picks its clock and executors by it."""
        for step in self.steps:
            if step.kind == "advance":
                return f"step {step.number} uses advance (the virtual clock)"
            if step.kind == "submit":
                for job in step.value:
                    if job.spec.duration_s is not None or job.spec.checkpoint is not None:
                        return f"job {job.id} uses duration/checkpoint (simulated work)"
        return None


# -- what the file's numbers mean (the scenario engines and the trace simulator alike) -------


def compute_pool_of(scenario: Scenario) -> str:
    compute_pool = scenario.config.default_compute_pool
    assert compute_pool is not None  # the parser fills it in
    return compute_pool


def project_terms(
    entry: ProjectEntry, pools: list[str], compute_pool: str
) -> dict[str, ProjectTerms]:
    """A project's terms per pool. A bare quota or limit is for the default compute pool;
    a bare weight or priority applies in every pool."""

    def pick(values: dict[str | None, int] | None, pool: str, everywhere: bool) -> int | None:
        if values is None:
            return None
        if pool in values:
            return values[pool]
        if None in values and (everywhere or pool == compute_pool):
            return values[None]
        return None

    terms: dict[str, ProjectTerms] = {}
    for pool in pools:
        weight = pick(entry.over_quota_weight, pool, everywhere=True)
        priority = pick(entry.priority, pool, everywhere=True)
        terms[pool] = ProjectTerms(
            quota=pick(entry.quota, pool, everywhere=False) or 0,
            over_quota_weight=1 if weight is None else weight,
            limit=pick(entry.limit, pool, everywhere=False),
            priority=100 if priority is None else priority,
        )
    return terms


# -- the file's shape -------------------------------------------------------------------------


class Seconds(float):
    """A duration, written as `events.units` reads them (`90s`, `10m`, `2h`, `1d`, `45`)."""


class PositiveSeconds(float):
    """A duration longer than zero."""


Name = Annotated[str, msgspec.Meta(pattern=NAME.pattern)]
Count = Annotated[int, msgspec.Meta(ge=0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
#: A number for the default compute pool, or one per pool.
PerPool = Count | dict[str, Count]
JobIds = str | list[str]


def _strict_twin(cls: type[msgspec.Struct]) -> Any:
    """The same fields as `cls`, but an unknown key is an error: events' value types read
    newer versions tolerantly, a file a person writes is read strictly."""
    fields = [
        (f.name, f.type) if f.default is msgspec.NODEFAULT else (f.name, f.type, f.default)
        for f in msgspec.structs.fields(cls)
    ]
    return msgspec.defstruct(cls.__name__, fields, forbid_unknown_fields=True, frozen=True)


if TYPE_CHECKING:  # to the type checker they are the structs they copy
    _PriorityClass = PriorityClass
else:
    _PriorityClass = _strict_twin(PriorityClass)


_T = TypeVar("_T", bound=msgspec.Struct)


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _Node(_Strict, frozen=True):
    name: Name
    gpus: Count


class _Scheduler(_Strict, frozen=True):
    """`SchedulerSettings` as a file writes them: rule 11's half-life as a duration."""

    type: SchedulerType = "fair_share"
    fitting: Fitting = "best"
    victim_order: VictimOrder = "newest"
    usage_half_life: Seconds | None = None
    usage_k: float = 1.0


class _Pool(_Strict, frozen=True):
    name: Name
    scheduler: _Scheduler | None = None
    nodes: tuple[_Node, ...] = ()


class _Config(_Strict, frozen=True):
    scheduler: _Scheduler | None = None
    preemption_grace: Seconds = Seconds(30.0)
    priority_classes: tuple[_PriorityClass, ...] = ()
    default_compute_pool: str | None = None
    default_aux_pool: str | None = None


class _Project(_Strict, frozen=True):
    name: Name
    quota: PerPool | None = None
    over_quota_weight: PerPool | None = None
    limit: PerPool | None = None
    priority: int | dict[str, int] | None = None


class _Checkpoint(_Strict, frozen=True):
    every: PositiveSeconds
    save: Seconds = Seconds(0.0)
    restore: Seconds = Seconds(0.0)


class _Job(_Strict, frozen=True):
    id: Name
    project: str
    class_: str | None = msgspec.field(default=None, name="class")
    priority: int | None = None
    preemptible: bool | None = None
    gpus: Count = 1
    replicas: AtLeastOne = 1
    min_replicas: AtLeastOne | None = None
    pool: str | list[str] | None = None
    node: str | None = None
    preemption_delay: Seconds = Seconds(0.0)
    min_runtime: Seconds = Seconds(0.0)
    duration: PositiveSeconds | None = None
    checkpoint: _Checkpoint | None = None
    #: host ports each replica publishes: PORT, or "HOST:CONTAINER"
    ports: list[int | str] = []


class _AddNode(_Strict, frozen=True):
    pool: str
    name: Name
    gpus: Count


class _Expect(_Strict, frozen=True):
    running: JobIds | None = None
    pending: JobIds | None = None
    paused: JobIds | None = None
    completed: JobIds | None = None
    failed: JobIds | None = None
    cancelled: JobIds | None = None
    rejected: list[str] | dict[str, str] | None = None
    preempted: dict[str, Count] | None = None
    replicas: dict[str, Count] | None = None
    placed_on: dict[str, list[str]] | None = None
    usage: dict[str, PerPool] | None = None
    fair_share: dict[str, PerPool] | None = None
    free: dict[str, Count] | None = None
    stable: bool = False
    events: dict[str, list[str]] | None = None


class _Step(_Strict, frozen=True):
    """One key of these (checked before conversion)."""

    submit: _Job | list[_Job] | None = None
    complete: JobIds | None = None
    fail: JobIds | None = None
    cancel: JobIds | None = None
    pause: JobIds | None = None
    resume: JobIds | None = None
    set_project: _Project | None = None
    add_node: _AddNode | None = None
    remove_node: str | None = None
    cordon: str | None = None
    drain: str | None = None
    uncordon: str | None = None
    advance: Seconds | None = None
    expect: _Expect | None = None


class _File(_Strict, frozen=True):
    name: str
    steps: tuple[_Step, ...]
    description: str = ""
    config: _Config = _Config()
    pools: tuple[_Pool, ...] | None = None
    projects: tuple[_Project, ...] = ()


def _durations(kind: type, value: Any) -> Any:
    """msgspec's hook for the duration types: the message names the bad value."""
    if kind is Seconds or kind is PositiveSeconds:
        seconds = parse_duration(value)  # a ValueError names the value
        if kind is PositiveSeconds and seconds == 0:
            raise ValueError(f"{value!r} is not a duration longer than zero")
        return kind(seconds)
    raise NotImplementedError(kind)


# -- reading ----------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read the file ({e.strerror})") from None
    try:
        data = YAML(typ="safe", pure=True).load(text)
    except YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
    return parse_scenario(data, path)


def parse_scenario(data: object, path: Path) -> Scenario:
    _check_step_shapes(data, path)
    try:
        file = msgspec.convert(data, _File, dec_hook=_durations)
    except msgspec.ValidationError as e:
        raise ScenarioError(f"{path}: {_readable(str(e), data)}") from None
    return _Reader(path).scenario(file)


def _check_step_shapes(data: object, path: Path) -> None:
    steps = data.get("steps") if isinstance(data, dict) else None
    for i, item in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(item, dict) or len(item) != 1:
            raise ScenarioError(
                f"{path}: step {i + 1}: a step is a mapping with exactly one key, one of "
                + ", ".join(STEP_KINDS)
            )


_AT: Final = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT: Final = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_PLAIN: Final = (
    (re.compile(r"Object contains unknown field `(.+)`"), "unknown key '{0}'; allowed: {keys}"),
    (re.compile(r"Object missing required field `(.+)`"), "missing required key '{0}'"),
    (re.compile(r"Expected `int` >= (\d+)"), "must be {0} or more"),
    (re.compile(r"Expected `str` matching regex .*"), "not a valid name (letters, digits, -, _)"),
    (re.compile(r"Expected `([^`]+)`, got `[^`]+`"), "expected {0}"),
)
#: msgspec's type names as FORMAT.md says them.
_TYPE_WORDS: Final = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "nothing",
}


def _readable(error: str, data: object) -> str:
    """msgspec's message with its path (`$.steps[0].submit`) as a person counts (`step 1
    submit`), in FORMAT.md's words, with the value that was there."""
    match = _AT.match(error)
    assert match is not None  # the pattern matches any text
    message, segments = match["message"], _SEGMENT.findall(match["path"] or "")
    for pattern, plain in _PLAIN:
        found = pattern.fullmatch(message)
        if found is not None:
            keys = ", ".join(map(repr, _keys_at(segments)))
            message = plain.format(*map(_in_words, found.groups()), keys=keys)
            break
    where, value = _where(segments, data)
    if value is not _MISSING and "key '" not in message and repr(value) not in message:
        message += f", got {value!r}"
    return f"{where}: {message}" if where else message


def _keys_at(segments: list[tuple[str, str]]) -> list[str]:
    """The keys the file's shape allows at a path (following `_File`'s types)."""
    found: list[msgspec.inspect.Type] = [msgspec.inspect.type_info(_File)]
    for key, _ in segments:
        options = [o for t in found for o in (t.types if isinstance(t, UnionType) else (t,))]
        if key:
            found = [
                f.type
                for o in options
                if isinstance(o, StructType)
                for f in o.fields
                if f.encode_name == key
            ]
        else:
            found = [o.item_type for o in options if isinstance(o, ListType | VarTupleType)]
            found += [o.value_type for o in options if isinstance(o, DictType)]
    options = [o for t in found for o in (t.types if isinstance(t, UnionType) else (t,))]
    return sorted({f.encode_name for o in options if isinstance(o, StructType) for f in o.fields})


def _in_words(types: str) -> str:
    """`int | object` -> `a whole number or a mapping`; other text stays as it is."""
    return " or ".join(_TYPE_WORDS.get(t, t) for t in types.split(" | "))


_MISSING: Final = object()


def _where(segments: list[tuple[str, str]], data: object) -> tuple[str, object]:
    """The path as words, and the value at it (or _MISSING where it cannot be followed)."""
    words: list[str] = []
    value: object = data
    for key, index in segments:
        if key:
            words.append(key)
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        elif index == "...":
            value = _MISSING  # a dict's value: msgspec does not say which key
        else:
            i = int(index)
            steps = words == ["steps"]
            words[-1:] = [f"step {i + 1}"] if steps else [*words[-1:], f"#{i + 1}"]
            value = value[i] if isinstance(value, list) and i < len(value) else _MISSING
    return " ".join(words), value


class _Reader:
    """From the converted file to the `Scenario`, checking what parts say about each other."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.jobs: set[str] = set()
        self.nodes: set[str] = set()

    def error(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.path}: {where}: {message}")

    def scenario(self, file: _File) -> Scenario:
        pools = self.pools(file.pools)
        names = [p.name for p in pools]
        config = self.config(file.config, names)
        projects = tuple(_project(p) for p in file.projects)
        self.unique([p.name for p in projects], "projects", "project")
        return Scenario(
            path=self.path,
            name=file.name,
            description=file.description,
            config=config,
            pools=pools,
            projects=projects,
            steps=tuple(self.step(i + 1, s) for i, s in enumerate(file.steps)),
        )

    def config(self, raw: _Config, pools: list[str]) -> ConfigureCluster:
        for key in ("default_compute_pool", "default_aux_pool"):
            value = getattr(raw, key)
            if value is not None and value not in pools:
                raise self.error(f"config {key}", f"unknown pool {value!r} (pools: {pools})")
        classes = tuple(_copy(c, PriorityClass) for c in raw.priority_classes)
        self.unique([c.name for c in classes], "config priority_classes", "priority class")
        compute_pool = raw.default_compute_pool or pools[0]
        self.usage_settings(raw.scheduler, "config scheduler")
        return ConfigureCluster(
            scheduler=_settings(raw.scheduler) or SchedulerSettings(),
            preemption_grace_s=float(raw.preemption_grace),
            priority_classes=classes,
            default_compute_pool=compute_pool,
            default_aux_pool=raw.default_aux_pool or compute_pool,
        )

    def pools(self, raw: tuple[_Pool, ...] | None) -> tuple[PoolEntry, ...]:
        if raw is None:
            return (PoolEntry("default", None, ()),)
        for p in raw:
            self.usage_settings(p.scheduler, f"pool {p.name} scheduler")
        pools = tuple(
            PoolEntry(
                p.name,
                _settings(p.scheduler),
                tuple(NodeEntry(n.name, n.gpus, p.name) for n in p.nodes),
            )
            for p in raw
        )
        self.unique([p.name for p in pools], "pools", "pool")
        self.unique([n.name for p in pools for n in p.nodes], "pools", "node")
        self.nodes = {n.name for p in pools for n in p.nodes}
        return pools

    def usage_settings(self, raw: _Scheduler | None, where: str) -> None:
        """Rule 11's bounds: the error names the key and the value as written."""
        if raw is None:
            return
        half_life = None if raw.usage_half_life is None else float(raw.usage_half_life)
        problem = settings_problem(half_life, raw.usage_k)
        if problem is not None:
            raise self.error(where, problem)

    def step(self, number: int, raw: _Step) -> Step:
        kind = next(k for k in STEP_KINDS if getattr(raw, k) is not None)
        value = getattr(raw, kind)
        where = f"step {number} {kind}"
        parsed: Any
        if kind == "submit":
            parsed = [self.job(j, where) for j in (value if isinstance(value, list) else [value])]
        elif kind in ("complete", "fail", "cancel", "pause", "resume"):
            parsed = self.job_ids(value, where)
        elif kind == "set_project":
            parsed = _project(value)
        elif kind == "add_node":
            parsed = NodeEntry(value.name, value.gpus, value.pool)
            self.nodes.add(value.name)
        elif kind in ("remove_node", "cordon", "drain", "uncordon"):
            if value not in self.nodes:
                raise self.error(where, f"unknown node {value!r}")
            parsed = value
        elif kind == "advance":
            parsed = float(value)
        else:
            parsed = self.expectation(value, where)
        return Step(number, kind, parsed)

    def job(self, raw: _Job, where: str) -> JobEntry:
        if raw.id in self.jobs:
            raise self.error(where, f"job id {raw.id!r} was already submitted")
        self.jobs.add(raw.id)
        if raw.min_replicas is not None and raw.min_replicas > raw.replicas:
            raise self.error(
                f"{where} job {raw.id} min_replicas",
                f"{raw.min_replicas} is more than replicas ({raw.replicas})",
            )
        pools = (raw.pool,) if isinstance(raw.pool, str) else tuple(raw.pool or ())
        checkpoint = raw.checkpoint
        spec = JobSpec(
            project=raw.project,
            priority_class=raw.class_,
            priority=raw.priority,
            preemptible=raw.preemptible,
            gpus=raw.gpus,
            replicas=raw.replicas,
            min_replicas=raw.min_replicas,
            pools=pools,
            node=raw.node,
            preemption_delay_s=float(raw.preemption_delay),
            min_runtime_s=float(raw.min_runtime),
            duration_s=None if raw.duration is None else float(raw.duration),
            checkpoint=None
            if checkpoint is None
            else CheckpointModel(
                every_s=float(checkpoint.every),
                save_s=float(checkpoint.save),
                restore_s=float(checkpoint.restore),
            ),
            ports=tuple(self.port(value, f"{where} job {raw.id} ports") for value in raw.ports),
        )
        return JobEntry(raw.id, spec)

    def port(self, value: int | str, where: str) -> PortMapping:
        """PORT or "HOST:CONTAINER", as numbers (their range is admission's to check, as it is
        for a submission)."""
        if isinstance(value, int):
            return PortMapping(value, value)
        host, colon, container = value.partition(":")
        try:
            return PortMapping(int(host), int(container) if colon else int(host))
        except ValueError:
            raise self.error(where, f"{value!r} is not PORT or HOST:CONTAINER") from None

    def job_ids(self, value: JobIds | list[str], where: str) -> list[str]:
        ids = [value] if isinstance(value, str) else list(value)
        for job_id in ids:
            if job_id not in self.jobs:
                raise self.error(
                    where, f"unknown job id {job_id!r} (not submitted before this step)"
                )
        return ids

    def expectation(self, raw: _Expect, where: str) -> Expectation:
        lists = {
            k: tuple(self.job_ids(getattr(raw, k), f"{where} {k}"))
            for k in JOB_LIST_KINDS
            if getattr(raw, k) is not None
        }
        for key in ("rejected", "preempted", "replicas", "placed_on", "events"):
            named = getattr(raw, key)
            if named is not None:
                self.job_ids(list(named), f"{where} {key}")
        rejected: dict[str, str | None] | None = None
        if isinstance(raw.rejected, list):
            rejected = dict.fromkeys(raw.rejected)
        elif raw.rejected is not None:
            rejected = dict(raw.rejected)
        return Expectation(
            lists=lists,
            rejected=rejected,
            preempted=raw.preempted,
            replicas=raw.replicas,
            placed_on=_tuples(raw.placed_on),
            usage=_per_project(raw.usage),
            fair_share=_per_project(raw.fair_share),
            free=raw.free,
            stable=raw.stable,
            events=_tuples(raw.events),
        )

    def unique(self, names: list[str], where: str, what: str) -> None:
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise self.error(where, f"{what} {name!r} is defined twice")
            seen.add(name)


def _copy(twin: Any, cls: type[_T]) -> _T:
    """A strict twin's value as the struct it copies."""
    return cls(**msgspec.structs.asdict(twin))


def _settings(raw: _Scheduler | None) -> SchedulerSettings | None:
    if raw is None:
        return None
    half_life = None if raw.usage_half_life is None else float(raw.usage_half_life)
    return SchedulerSettings(
        type=raw.type,
        fitting=raw.fitting,
        victim_order=raw.victim_order,
        usage_half_life_s=half_life,
        usage_k=raw.usage_k,
    )


def _per_pool(value: int | dict[str, int] | None) -> dict[str | None, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return {None: value}
    return {pool: n for pool, n in value.items()}


def _project(raw: _Project) -> ProjectEntry:
    return ProjectEntry(
        name=raw.name,
        quota=_per_pool(raw.quota),
        limit=_per_pool(raw.limit),
        over_quota_weight=_per_pool(raw.over_quota_weight),
        priority=_per_pool(raw.priority),
    )


def _per_project(
    values: dict[str, int | dict[str, int]] | None,
) -> dict[str, dict[str | None, int]] | None:
    if values is None:
        return None
    return {project: _per_pool(v) or {} for project, v in values.items()}


def _tuples(values: dict[str, list[str]] | None) -> dict[str, tuple[str, ...]] | None:
    return None if values is None else {k: tuple(v) for k, v in values.items()}
