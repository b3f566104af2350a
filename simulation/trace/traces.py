"""Workload traces: the published ones under shared/traces, and the project's own formats.

Every loader returns `TraceJob`s sorted by submission time (stable: file order among equals),
with times in seconds on the trace's own clock:

- `philly` (and `philly:11vc`, only the 11 virtual clusters that philly_vc.csv sizes): one job per
  row of philly/philly.csv, id `philly-<row>` (1-based data row), submitted at its `timestamp`
  (read as UTC, seconds since the epoch), project = its virtual cluster (`cluster` column).
- `itp:clusterNN` (or `itp:NN`): msft-itp/clusterNN.csv; `submission_time` is seconds since the
  start of collection. It has no project column: see `split_project`.
- `muri`: muri-testbed/cluster_trace.csv, the 400-job Muri testbed trace; its times are
  milliseconds and are divided by 1000. Its `priority` column is kept. No project column.
- a path ending in .csv: columns `job_id,submit_s,duration_s,gpus` and optionally `project` and
  `priority` (any order, header required, nothing else).
- a path ending in .yaml or .yml: `jobs:` a list of `{id, submit, duration, gpus, project,
  priority}`; submit and duration are seconds or durations like `2h`; project and priority are
  optional.

Jobs without a project are split into `split` projects `p0` ... by a CRC-32 of the job id
(stable across runs and slices; `split=1` puts everything in `p0`).
"""

from __future__ import annotations

import csv
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from policy.commands.names import is_name
from simulation.trace.errors import SimulationError
from simulation.trace.units import parse_duration

TRACES_ENV: Final = "FAIRLANE_TRACES"
PUBLISHED: Final = ("philly", "philly:11vc", "itp:clusterNN", "muri")
_REPO_ROOT: Final = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    duration_s: float
    gpus: int
    project: str
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class Slice:
    """Which jobs of a trace to keep. `start`/`end` are inclusive, as given on the command line:
    dates for philly, seconds of the trace's clock for the others."""

    start: str | None = None
    end: str | None = None
    projects: tuple[str, ...] = ()
    first: int | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    jobs: list[TraceJob]
    #: Whether `start`/`end` are dates (philly) rather than seconds.
    dated: bool = False


def find_traces_dir(explicit: Path | None = None) -> Path:
    """--traces-dir, else $FAIRLANE_TRACES, else the first shared/traces found walking up from
    the repository root."""
    if explicit is not None:
        where = f"--traces-dir {explicit}"
        found = explicit
    elif os.environ.get(TRACES_ENV):
        found = Path(os.environ[TRACES_ENV])
        where = f"${TRACES_ENV}={found}"
    else:
        for folder in (_REPO_ROOT, *_REPO_ROOT.parents):
            if (folder / "shared" / "traces").is_dir():
                return folder / "shared" / "traces"
        raise SimulationError(
            f"no shared/traces folder above {_REPO_ROOT}: give --traces-dir or set ${TRACES_ENV}"
        )
    if not found.is_dir():
        raise SimulationError(f"{where}: not a folder")
    return found


def load_trace(name: str, traces_dir: Path | None = None, split: int = 1) -> Trace:
    """A published trace by name, or a file in the project's own CSV or YAML format."""
    if split < 1:
        raise SimulationError(f"--split must be 1 or more, got {split}")
    if name in ("philly", "philly:11vc"):
        folder = find_traces_dir(traces_dir)
        vcs = _philly_vcs(folder) if name == "philly:11vc" else None
        return Trace(name, _sorted(_philly(folder / "philly" / "philly.csv", vcs)), dated=True)
    if name.startswith("itp:"):
        path = find_traces_dir(traces_dir) / "msft-itp" / f"{_itp_cluster(name)}.csv"
        return Trace(name, _sorted(_itp(path, split)))
    if name == "muri":
        path = find_traces_dir(traces_dir) / "muri-testbed" / "cluster_trace.csv"
        return Trace(name, _sorted(_muri(path, split)))
    path = Path(name)
    if path.suffix in (".csv", ".yaml", ".yml"):
        if not path.is_file():
            raise SimulationError(f"trace file {name!r} does not exist")
        jobs = _own_csv(path, split) if path.suffix == ".csv" else _own_yaml(path, split)
        _check_ids(jobs, path)
        return Trace(name, _sorted(jobs))
    raise SimulationError(
        f"unknown trace {name!r}: use {', '.join(PUBLISHED)}, or a .csv or .yaml file"
    )


def select(trace: Trace, part: Slice) -> list[TraceJob]:
    """The jobs of `part`, in submission order."""
    jobs = trace.jobs
    if part.start is not None or part.end is not None:
        low, high = _bounds(part, trace.dated)
        jobs = [j for j in jobs if low <= j.submit_s <= high]
    if part.projects:
        known = {j.project for j in trace.jobs}
        unknown = [p for p in part.projects if p not in known]
        if unknown:
            listed = ", ".join(sorted(known)[:20]) + (" ..." if len(known) > 20 else "")
            raise SimulationError(
                f"--projects: {unknown[0]!r} is not a project of trace {trace.name} "
                f"(it has {listed})"
            )
        wanted = set(part.projects)
        jobs = [j for j in jobs if j.project in wanted]
    if part.first is not None:
        if part.first < 1:
            raise SimulationError(f"--first must be 1 or more, got {part.first}")
        jobs = jobs[: part.first]
    return jobs


def split_project(job_id: str, split: int) -> str:
    return f"p{zlib.crc32(job_id.encode()) % split}"


# -- slicing -----------------------------------------------------------------------------------


def _bounds(part: Slice, dated: bool) -> tuple[float, float]:
    low = float("-inf") if part.start is None else _instant(part.start, "--from", dated, False)
    high = float("inf") if part.end is None else _instant(part.end, "--to", dated, True)
    if low > high:
        raise SimulationError(f"--from {part.start} is after --to {part.end}")
    return low, high


def _instant(text: str, option: str, dated: bool, end: bool) -> float:
    if not dated:
        try:
            return float(text)
        except ValueError:
            raise SimulationError(
                f"{option}: {text!r} is not a number of seconds (only philly takes dates)"
            ) from None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SimulationError(
            f"{option}: {text!r} is not a date like 2017-10-01 or '2017-10-01 12:00:00'"
        ) from None
    if end and len(text.strip()) == 10:
        # a bare date as the end of a range means the whole of that day
        moment += timedelta(days=1) - timedelta(microseconds=1)
    return moment.replace(tzinfo=UTC).timestamp()


# -- the published traces ----------------------------------------------------------------------


def _philly_vcs(folder: Path) -> set[str]:
    rows = _rows(folder / "philly" / "philly_vc.csv", ("vc", "node num"), ())
    return {row["vc"] for _, row in rows}


def _philly(path: Path, vcs: set[str] | None) -> Iterator[TraceJob]:
    for line, row in _rows(path, ("timestamp", "duration", "num_gpus", "cluster"), ("gpu_time",)):
        if vcs is not None and row["cluster"] not in vcs:
            continue
        try:
            moment = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC)
        except ValueError:
            raise SimulationError(f"{path}:{line}: bad timestamp {row['timestamp']!r}") from None
        yield TraceJob(
            job_id=f"philly-{line - 1}",
            submit_s=moment.timestamp(),
            duration_s=_positive(row["duration"], path, line, "duration"),
            gpus=_gpus(row["num_gpus"], path, line),
            project=row["cluster"],
        )


def _itp_cluster(name: str) -> str:
    which = name.removeprefix("itp:").removeprefix("cluster")
    if not which.isdigit() or not 1 <= int(which) <= 10:
        raise SimulationError(
            f"unknown ITP cluster in {name!r}: use itp:cluster01 ... itp:cluster10"
        )
    return f"cluster{int(which):02d}"


def _itp(path: Path, split: int) -> Iterator[TraceJob]:
    for line, row in _rows(path, ("job_id", "submission_time", "duration", "num_gpu"), ()):
        yield TraceJob(
            job_id=row["job_id"],
            submit_s=_number(row["submission_time"], path, line, "submission_time"),
            duration_s=_positive(row["duration"], path, line, "duration"),
            gpus=_gpus(row["num_gpu"], path, line),
            project=split_project(row["job_id"], split),
        )


_MURI_OTHER: Final = (
    "iterations",
    "model_name",
    "batch_size",
    "interval",
    "iteration_time",
    "resource_time_0",
    "resource_time_1",
    "resource_time_2",
)


def _muri(path: Path, split: int) -> Iterator[TraceJob]:
    required = ("job_id", "num_gpu", "submit_time", "duration", "priority")
    for line, row in _rows(path, required, _MURI_OTHER):
        yield TraceJob(
            job_id=row["job_id"],
            submit_s=_number(row["submit_time"], path, line, "submit_time") / 1000.0,
            duration_s=_positive(row["duration"], path, line, "duration") / 1000.0,
            gpus=_gpus(row["num_gpu"], path, line),
            project=split_project(row["job_id"], split),
            priority=_integer(row["priority"], path, line, "priority"),
        )


# -- the project's own formats -----------------------------------------------------------------


def _own_csv(path: Path, split: int) -> list[TraceJob]:
    jobs = []
    for line, row in _rows(
        path, ("job_id", "submit_s", "duration_s", "gpus"), ("project", "priority")
    ):
        job_id = row["job_id"]
        project = row.get("project") or split_project(job_id, split)
        priority = row.get("priority")
        jobs.append(
            TraceJob(
                job_id=job_id,
                submit_s=_number(row["submit_s"], path, line, "submit_s"),
                duration_s=_positive(row["duration_s"], path, line, "duration_s"),
                gpus=_gpus(row["gpus"], path, line),
                project=project,
                priority=_integer(priority, path, line, "priority") if priority else None,
            )
        )
    return jobs


_YAML_JOB_KEYS: Final = frozenset({"id", "submit", "duration", "gpus", "project", "priority"})


def _own_yaml(path: Path, split: int) -> list[TraceJob]:
    try:
        data = YAML(typ="safe", pure=True).load(path.read_text())
    except (OSError, YAMLError) as e:
        raise SimulationError(f"{path}: cannot read it as YAML: {e}") from None
    if not isinstance(data, dict) or set(data) != {"jobs"} or not isinstance(data["jobs"], list):
        raise SimulationError(f"{path}: expected a mapping with one key, jobs: a list of jobs")
    jobs = []
    for n, item in enumerate(data["jobs"], start=1):
        where = f"{path}: job #{n}"
        if not isinstance(item, dict):
            raise SimulationError(f"{where}: expected a mapping, got {item!r}")
        unknown = sorted(set(item) - _YAML_JOB_KEYS)
        missing = sorted({"id", "submit", "duration", "gpus"} - set(item))
        if unknown or missing:
            problem = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
            raise SimulationError(f"{where}: {problem} (keys: {', '.join(sorted(_YAML_JOB_KEYS))})")
        job_id = str(item["id"])
        duration = parse_duration(item["duration"], f"{where} duration")
        if duration <= 0:
            raise SimulationError(f"{where}: duration must be positive, got {item['duration']!r}")
        gpus, priority = item["gpus"], item.get("priority")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise SimulationError(
                f"{where}: gpus must be a whole number of 1 or more, got {gpus!r}"
            )
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise SimulationError(f"{where}: priority must be a whole number, got {priority!r}")
        jobs.append(
            TraceJob(
                job_id=job_id,
                submit_s=parse_duration(item["submit"], f"{where} submit"),
                duration_s=duration,
                gpus=gpus,
                project=str(item["project"]) if "project" in item else split_project(job_id, split),
                priority=priority,
            )
        )
    return jobs


# -- helpers -----------------------------------------------------------------------------------


def _rows(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row, after checking the header names exactly the
    required columns and nothing but the optional ones besides."""
    try:
        handle = path.open(newline="")
    except OSError as e:
        raise SimulationError(f"cannot read trace file {path}: {e.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in required if c not in header]
        extra = [c for c in header if c not in required and c not in optional]
        if missing or extra:
            problem = f"no column {missing[0]!r}" if missing else f"unknown column {extra[0]!r}"
            allowed = ", ".join((*required, *optional))
            raise SimulationError(f"{path}: {problem} (columns: {allowed})")
        width = len(header)
        for line, cells in enumerate(reader, start=2):
            if not cells:
                continue
            if len(cells) != width:
                raise SimulationError(f"{path}:{line}: {len(cells)} fields, the header has {width}")
            yield line, dict(zip(header, (c.strip() for c in cells), strict=True))


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SimulationError(f"{path}:{line}: {column} {text!r} is not a number") from None


def _positive(text: str, path: Path, line: int, column: str) -> float:
    value = _number(text, path, line, column)
    if not value > 0:
        raise SimulationError(f"{path}:{line}: {column} must be positive, got {text!r}")
    return value


def _integer(text: str, path: Path, line: int, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SimulationError(f"{path}:{line}: {column} {text!r} is not a whole number") from None


def _gpus(text: str, path: Path, line: int) -> int:
    value = _integer(text, path, line, "gpus")
    if value < 1:
        raise SimulationError(f"{path}:{line}: gpus must be 1 or more, got {text!r}")
    return value


def _check_ids(jobs: list[TraceJob], path: Path) -> None:
    seen: set[str] = set()
    for job in jobs:
        if not is_name(job.job_id):
            raise SimulationError(
                f"{path}: job id {job.job_id!r} is not valid (1-128 letters, digits, '-' or '_')"
            )
        if job.job_id in seen:
            raise SimulationError(f"{path}: job id {job.job_id!r} appears twice")
        seen.add(job.job_id)


def _sorted(jobs: Iterator[TraceJob] | list[TraceJob]) -> list[TraceJob]:
    return sorted(jobs, key=lambda j: j.submit_s)
