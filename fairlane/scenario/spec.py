"""Scenario files (scenarios/FORMAT.md), parsed strictly.

YAML is read with YAML 1.2 rules (`on`, `no`, `yes` stay strings). Every mapping is checked
against the keys FORMAT.md allows, every value against its type, and every job id a step names
against the jobs submitted before it, so a typo cannot silently pass: the error names the file,
the step and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from events import CheckpointModel, JobSpec, PriorityClass, SchedulerSettings
from policy.commands.names import is_name


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
    "advance",
    "expect",
)
JOB_LIST_KINDS: Final = ("running", "pending", "paused", "completed", "failed", "cancelled")


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
class Config:
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    preemption_grace_s: float = 30.0
    priority_classes: tuple[PriorityClass, ...] = ()
    default_compute_pool: str | None = None
    default_aux_pool: str | None = None


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
    config: Config
    pools: tuple[PoolEntry, ...]
    projects: tuple[ProjectEntry, ...]
    steps: tuple[Step, ...]

    @property
    def needs_virtual_clock(self) -> str | None:
        """Why the live engine cannot run this scenario, or None if it can."""
        for step in self.steps:
            if step.kind == "advance":
                return f"step {step.number} uses advance (the virtual clock)"
            if step.kind == "submit":
                for job in step.value:
                    if job.spec.duration_s is not None or job.spec.checkpoint is not None:
                        return f"job {job.id} uses duration/checkpoint (simulated work)"
        return None


# -- parsing ----------------------------------------------------------------------------------

_DURATION: Final = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


class _Where:
    """Where in the file we are, for error messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parts: list[str] = []

    def at(self, *parts: str) -> _Where:
        w = _Where(self.path)
        w.parts = [*self.parts, *parts]
        return w

    def error(self, message: str) -> ScenarioError:
        where = " ".join(self.parts)
        return ScenarioError(f"{self.path}: {where + ': ' if where else ''}{message}")


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    where = _Where(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise where.error(f"cannot read the file ({e.strerror})") from None
    try:
        data = YAML(typ="safe", pure=True).load(text)
    except YAMLError as e:
        raise where.error(f"not valid YAML: {e}") from None
    return parse_scenario(data, path)


def parse_scenario(data: object, path: Path) -> Scenario:
    where = _Where(path)
    top = _mapping(
        data,
        where,
        required={"name", "steps"},
        allowed={"name", "description", "config", "pools", "projects", "steps"},
    )
    config = _config(top.get("config", {}), where.at("config"))
    pools = _pools(top.get("pools"), where.at("pools"))
    pool_names = [p.name for p in pools]
    for key in ("default_compute_pool", "default_aux_pool"):
        value = getattr(config, key)
        if value is not None and value not in pool_names:
            raise where.at("config", key).error(f"unknown pool {value!r} (pools: {pool_names})")
    projects = tuple(
        _project(p, where.at("projects", f"#{i + 1}"), partial=False)
        for i, p in enumerate(_list(top.get("projects", []), where.at("projects")))
    )
    _unique([p.name for p in projects], where.at("projects"), "project")
    steps = _steps(top["steps"], where, {n.name for p in pools for n in p.nodes})
    return Scenario(
        path=path,
        name=_str(top["name"], where.at("name")),
        description=_str(top.get("description", ""), where.at("description")),
        config=config,
        pools=pools,
        projects=projects,
        steps=steps,
    )


def _config(data: object, where: _Where) -> Config:
    m = _mapping(
        data,
        where,
        allowed={
            "scheduler",
            "preemption_grace",
            "priority_classes",
            "default_compute_pool",
            "default_aux_pool",
        },
    )
    classes: tuple[PriorityClass, ...] = ()
    if "priority_classes" in m:
        items = _list(m["priority_classes"], where.at("priority_classes"))
        parsed = []
        for i, item in enumerate(items):
            w = where.at("priority_classes", f"#{i + 1}")
            c = _mapping(item, w, required={"name", "priority", "preemptible"})
            parsed.append(
                PriorityClass(
                    _str(c["name"], w.at("name")),
                    _int(c["priority"], w.at("priority")),
                    _bool(c["preemptible"], w.at("preemptible")),
                )
            )
        _unique([c.name for c in parsed], where.at("priority_classes"), "priority class")
        classes = tuple(parsed)
    return Config(
        scheduler=_scheduler(m.get("scheduler", {}), where.at("scheduler")),
        preemption_grace_s=_duration(
            m.get("preemption_grace", "30s"), where.at("preemption_grace")
        ),
        priority_classes=classes,
        default_compute_pool=_opt_str(
            m.get("default_compute_pool"), where.at("default_compute_pool")
        ),
        default_aux_pool=_opt_str(m.get("default_aux_pool"), where.at("default_aux_pool")),
    )


def _scheduler(data: object, where: _Where) -> SchedulerSettings:
    m = _mapping(data, where, allowed={"type", "fitting", "victim_order"})
    choices = {
        "type": ("fair_share", "priority", "round_robin"),
        "fitting": ("best", "worst"),
        "victim_order": ("newest", "cost"),
    }
    values: dict[str, str] = {}
    for key, allowed in choices.items():
        if key in m:
            value = _str(m[key], where.at(key))
            if value not in allowed:
                raise where.at(key).error(f"{value!r} is not one of {', '.join(allowed)}")
            values[key] = value
    return SchedulerSettings(**values)  # type: ignore[arg-type]


def _pools(data: object, where: _Where) -> tuple[PoolEntry, ...]:
    if data is None:
        return (PoolEntry("default", None, ()),)
    pools = []
    for i, item in enumerate(_list(data, where)):
        w = where.at(f"#{i + 1}")
        m = _mapping(item, w, required={"name"}, allowed={"name", "scheduler", "nodes"})
        name = _name(m["name"], w.at("name"))
        scheduler = _scheduler(m["scheduler"], w.at("scheduler")) if "scheduler" in m else None
        nodes = []
        for j, node in enumerate(_list(m.get("nodes", []), w.at("nodes"))):
            nw = w.at("nodes", f"#{j + 1}")
            n = _mapping(node, nw, required={"name", "gpus"})
            nodes.append(
                NodeEntry(_name(n["name"], nw.at("name")), _count(n["gpus"], nw.at("gpus")), name)
            )
        pools.append(PoolEntry(name, scheduler, tuple(nodes)))
    _unique([p.name for p in pools], where, "pool")
    _unique([n.name for p in pools for n in p.nodes], where, "node")
    return tuple(pools)


def _per_pool(
    data: object, where: _Where, *, allow_negative: bool = False
) -> dict[str | None, int]:
    if isinstance(data, dict):
        return {_str(k, where): _count(v, where.at(str(k))) for k, v in data.items()}
    return {None: _int(data, where) if allow_negative else _count(data, where)}


def _project(data: object, where: _Where, partial: bool) -> ProjectEntry:
    m = _mapping(
        data,
        where,
        required={"name"},
        allowed={"name", "quota", "over_quota_weight", "limit", "priority"},
    )
    return ProjectEntry(
        name=_name(m["name"], where.at("name")),
        quota=_per_pool(m["quota"], where.at("quota")) if "quota" in m else None,
        limit=_per_pool(m["limit"], where.at("limit")) if "limit" in m else None,
        over_quota_weight=(
            _per_pool(m["over_quota_weight"], where.at("over_quota_weight"))
            if "over_quota_weight" in m
            else None
        ),
        priority=(
            _per_pool(m["priority"], where.at("priority"), allow_negative=True)
            if "priority" in m
            else None
        ),
    )


_JOB_KEYS: Final = {
    "id",
    "project",
    "class",
    "priority",
    "preemptible",
    "gpus",
    "replicas",
    "min_replicas",
    "pool",
    "node",
    "preemption_delay",
    "min_runtime",
    "duration",
    "checkpoint",
}


def _job(data: object, where: _Where) -> JobEntry:
    m = _mapping(data, where, required={"id", "project"}, allowed=_JOB_KEYS)
    job_id = _name(m["id"], where.at("id"))
    w = where.at(f"job {job_id}")
    pools: tuple[str, ...] = ()
    if "pool" in m:
        raw = m["pool"]
        pools = (
            tuple(_str(p, w.at("pool")) for p in raw)
            if isinstance(raw, list)
            else (_str(raw, w.at("pool")),)
        )
    checkpoint = None
    if "checkpoint" in m:
        cw = w.at("checkpoint")
        c = _mapping(m["checkpoint"], cw, required={"every"}, allowed={"every", "save", "restore"})
        checkpoint = CheckpointModel(
            every_s=_duration(c["every"], cw.at("every"), positive=True),
            save_s=_duration(c.get("save", "0s"), cw.at("save")),
            restore_s=_duration(c.get("restore", "0s"), cw.at("restore")),
        )
    replicas = _count(m.get("replicas", 1), w.at("replicas"), minimum=1)
    min_replicas = (
        _count(m["min_replicas"], w.at("min_replicas"), minimum=1) if "min_replicas" in m else None
    )
    if min_replicas is not None and min_replicas > replicas:
        raise w.at("min_replicas").error(f"{min_replicas} is more than replicas ({replicas})")
    spec = JobSpec(
        project=_str(m["project"], w.at("project")),
        priority_class=_opt_str(m.get("class"), w.at("class")),
        priority=_int(m["priority"], w.at("priority")) if "priority" in m else None,
        preemptible=_bool(m["preemptible"], w.at("preemptible")) if "preemptible" in m else None,
        gpus=_count(m.get("gpus", 1), w.at("gpus")),
        replicas=replicas,
        min_replicas=min_replicas,
        pools=pools,
        node=_opt_str(m.get("node"), w.at("node")),
        preemption_delay_s=_duration(m.get("preemption_delay", "0s"), w.at("preemption_delay")),
        min_runtime_s=_duration(m.get("min_runtime", "0s"), w.at("min_runtime")),
        duration_s=_duration(m["duration"], w.at("duration"), positive=True)
        if "duration" in m
        else None,
        checkpoint=checkpoint,
    )
    return JobEntry(job_id, spec)


def _steps(data: object, where: _Where, nodes: set[str]) -> tuple[Step, ...]:
    steps: list[Step] = []
    jobs: set[str] = set()
    nodes = set(nodes)
    for i, item in enumerate(_list(data, where.at("steps"))):
        w = where.at(f"step {i + 1}")
        if not isinstance(item, dict) or len(item) != 1:
            raise w.error(
                "a step is a mapping with exactly one key, one of " + ", ".join(STEP_KINDS)
            )
        ((kind, value),) = item.items()
        if kind not in STEP_KINDS:
            raise w.error(f"unknown step {kind!r}; expected one of {', '.join(STEP_KINDS)}")
        w = w.at(str(kind))
        parsed: Any
        if kind == "submit":
            items = value if isinstance(value, list) else [value]
            parsed = [_job(j, w.at(f"#{k + 1}")) for k, j in enumerate(items)]
            for job in parsed:
                if job.id in jobs:
                    raise w.error(f"job id {job.id!r} was already submitted")
                jobs.add(job.id)
        elif kind in ("complete", "fail", "cancel", "pause", "resume"):
            parsed = _job_ids(value, w, jobs)
        elif kind == "set_project":
            parsed = _project(value, w, partial=True)
        elif kind == "add_node":
            m = _mapping(value, w, required={"pool", "name", "gpus"})
            parsed = NodeEntry(
                _name(m["name"], w.at("name")),
                _count(m["gpus"], w.at("gpus")),
                _str(m["pool"], w.at("pool")),
            )
            nodes.add(parsed.name)
        elif kind == "remove_node":
            parsed = _str(value, w)
            if parsed not in nodes:
                raise w.error(f"unknown node {parsed!r}")
        elif kind == "advance":
            parsed = _duration(value, w)
        else:
            parsed = _expectation(value, w, jobs)
        steps.append(Step(i + 1, str(kind), parsed))
    return tuple(steps)


def _job_ids(value: object, where: _Where, jobs: set[str]) -> list[str]:
    items = value if isinstance(value, list) else [value]
    ids = [_str(v, where) for v in items]
    for job_id in ids:
        if job_id not in jobs:
            raise where.error(f"unknown job id {job_id!r} (not submitted before this step)")
    return ids


def _expectation(value: object, where: _Where, jobs: set[str]) -> Expectation:
    allowed = {
        *JOB_LIST_KINDS,
        "rejected",
        "preempted",
        "replicas",
        "placed_on",
        "usage",
        "fair_share",
        "free",
        "stable",
        "events",
    }
    m = _mapping(value, where, allowed=allowed)
    lists: dict[str, tuple[str, ...]] = {
        k: tuple(_job_ids(m[k], where.at(k), jobs)) for k in JOB_LIST_KINDS if k in m
    }

    def job_map(key: str) -> dict[str, object] | None:
        if key not in m:
            return None
        d = _mapping(m[key], where.at(key))
        _job_ids(list(d), where.at(key), jobs)
        return d

    rejected: dict[str, str | None] | None = None
    if "rejected" in m:
        raw = m["rejected"]
        if isinstance(raw, list):
            rejected = dict.fromkeys(_job_ids(raw, where.at("rejected"), jobs))
        else:
            d = job_map("rejected") or {}
            rejected = {k: _str(v, where.at("rejected", k)) for k, v in d.items()}

    def counts(key: str) -> dict[str, int] | None:
        d = job_map(key)
        return None if d is None else {k: _count(v, where.at(key, k)) for k, v in d.items()}

    def project_pools(key: str) -> dict[str, dict[str | None, int]] | None:
        if key not in m:
            return None
        d = _mapping(m[key], where.at(key))
        return {_str(k, where.at(key)): _per_pool(v, where.at(key, str(k))) for k, v in d.items()}

    placed = job_map("placed_on")
    events = job_map("events")
    free = _mapping(m["free"], where.at("free")) if "free" in m else None
    return Expectation(
        lists=lists,
        rejected=rejected,
        preempted=counts("preempted"),
        replicas=counts("replicas"),
        placed_on=None
        if placed is None
        else {
            k: tuple(_str(n, where.at("placed_on", k)) for n in _list(v, where.at("placed_on", k)))
            for k, v in placed.items()
        },
        usage=project_pools("usage"),
        fair_share=project_pools("fair_share"),
        free=None
        if free is None
        else {
            _str(k, where.at("free")): _count(v, where.at("free", str(k))) for k, v in free.items()
        },
        stable=_bool(m["stable"], where.at("stable")) if "stable" in m else False,
        events=None
        if events is None
        else {
            k: tuple(_str(t, where.at("events", k)) for t in _list(v, where.at("events", k)))
            for k, v in events.items()
        },
    )


# -- scalar helpers ---------------------------------------------------------------------------


def _mapping(
    data: object, where: _Where, required: set[str] | None = None, allowed: set[str] | None = None
) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise where.error(f"expected a mapping, got {_show(data)}")
    for key in data:
        if not isinstance(key, str):
            raise where.error(f"keys must be strings, got {_show(key)}")
    keys = set(data)
    if allowed is not None:
        unknown = sorted(keys - allowed - (required or set()))
        if unknown:
            known = ", ".join(sorted(allowed | (required or set())))
            raise where.at(unknown[0]).error(f"unknown key {unknown[0]!r}; allowed: {known}")
    missing = sorted((required or set()) - keys)
    if missing:
        raise where.error(f"missing required key {missing[0]!r}")
    return data


def _list(data: object, where: _Where) -> list[Any]:
    if not isinstance(data, list):
        raise where.error(f"expected a list, got {_show(data)}")
    return data


def _str(data: object, where: _Where) -> str:
    if isinstance(data, bool) or not isinstance(data, str | int):
        raise where.error(f"expected a string, got {_show(data)}")
    return str(data)


def _name(data: object, where: _Where) -> str:
    name = _str(data, where)
    if not is_name(name):
        raise where.error(f"{name!r} is not a valid name (letters, digits, '-', '_')")
    return name


def _opt_str(data: object, where: _Where) -> str | None:
    return None if data is None else _str(data, where)


def _int(data: object, where: _Where) -> int:
    if isinstance(data, bool) or not isinstance(data, int):
        raise where.error(f"expected a whole number, got {_show(data)}")
    return data


def _count(data: object, where: _Where, minimum: int = 0) -> int:
    value = _int(data, where)
    if value < minimum:
        raise where.error(f"must be {minimum} or more, got {value}")
    return value


def _bool(data: object, where: _Where) -> bool:
    if not isinstance(data, bool):
        raise where.error(f"expected true or false, got {_show(data)}")
    return data


def _duration(data: object, where: _Where, positive: bool = False) -> float:
    if isinstance(data, int | float) and not isinstance(data, bool):
        seconds = float(data)
    elif isinstance(data, str) and data and (match := _DURATION.match(data.strip())):
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    else:
        raise where.error(f"{_show(data)} is not a duration like 90s, 10m or 2h")
    if seconds < 0 or (positive and seconds == 0):
        raise where.error(
            f"duration must be {'positive' if positive else 'zero or more'}, got {data!r}"
        )
    return seconds


def _unique(names: list[str], where: _Where, what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise where.error(f"{what} {name!r} is defined twice")
        seen.add(name)


def _show(data: object) -> str:
    return f"{type(data).__name__} {data!r}" if data is not None else "nothing"
