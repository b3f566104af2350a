"""Trace loaders: each published trace parses (small slices), the project's own formats, and
bad input is refused with a message that names the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.trace.errors import SimulationError
from simulation.trace.traces import (
    Slice,
    Trace,
    TraceJob,
    find_traces_dir,
    load_trace,
    select,
    split_project,
)


@pytest.fixture(scope="module")
def traces_dir() -> Path:
    try:
        return find_traces_dir()
    except SimulationError:
        pytest.skip("the published traces (shared/traces) are not here")


@pytest.fixture(scope="module")
def philly(traces_dir: Path) -> Trace:
    return load_trace("philly", traces_dir)


def test_philly_rows_become_jobs_of_their_virtual_cluster(philly: Trace) -> None:
    trace = philly
    assert len(trace.jobs) == 82_247 and trace.dated
    jobs = select(trace, Slice(start="2017-10-01", end="2017-10-01 00:10:00"))
    assert jobs and all(j.submit_s >= 1506816000 for j in jobs)  # 2017-10-01 00:00 UTC
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    # the README's first data row: 2017-10-09 07:01:55, 66 s, 1 GPU, VC 11cb48
    first_row = next(j for j in trace.jobs if j.job_id == "philly-1")
    assert (first_row.duration_s, first_row.gpus, first_row.project) == (66.0, 1, "11cb48")


def test_philly_11vc_slice_matches_the_readme(traces_dir: Path) -> None:
    trace = load_trace("philly:11vc", traces_dir)
    jobs = select(trace, Slice(start="2017-10-01", end="2017-11-30"))
    assert len(jobs) == 68_503  # README slice (a)
    assert len({j.project for j in jobs}) == 11


def test_itp_cluster_and_hash_split(traces_dir: Path) -> None:
    trace = load_trace("itp:cluster10", traces_dir, split=3)
    assert len(trace.jobs) == 260
    assert {j.project for j in trace.jobs} == {"p0", "p1", "p2"}
    assert all(j.project == split_project(j.job_id, 3) for j in trace.jobs)
    assert min(j.duration_s for j in trace.jobs) >= 600
    assert len(load_trace("itp:10", traces_dir).jobs) == 260
    assert len(select(trace, Slice(first=5))) == 5


def test_muri_times_are_milliseconds(traces_dir: Path) -> None:
    trace = load_trace("muri", traces_dir)
    assert len(trace.jobs) == 400
    job = next(j for j in trace.jobs if j.job_id == "1")
    # row: 1,8,1534000,...,duration 281000,...,priority 1
    assert (job.submit_s, job.duration_s, job.gpus, job.priority) == (1534.0, 281.0, 8, 1)
    assert {j.project for j in trace.jobs} == {"p0"}


def test_own_csv_format(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,submit_s,duration_s,gpus,project,priority\n"
        "b,20,100,2,team-b,\n"
        "a,10,50.5,1,team-a,3\n"
    )
    jobs = load_trace(str(path)).jobs
    assert jobs == [
        TraceJob("a", 10.0, 50.5, 1, "team-a", 3),
        TraceJob("b", 20.0, 100.0, 2, "team-b", None),
    ]
    assert [j.job_id for j in select(load_trace(str(path)), Slice(start="15", end="25"))] == ["b"]


def test_own_yaml_format(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "jobs:\n"
        "  - {id: x, submit: 1m, duration: 2h, gpus: 4, project: a}\n"
        "  - {id: y, submit: 0, duration: 90, gpus: 1, priority: 7}\n"
    )
    jobs = load_trace(str(path), split=1).jobs
    assert jobs == [TraceJob("y", 0.0, 90.0, 1, "p0", 7), TraceJob("x", 60.0, 7200.0, 4, "a")]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nope", "unknown trace 'nope'"),
        ("/no/such/file.csv", "'/no/such/file.csv' does not exist"),
    ],
)
def test_bad_trace_names(name: str, fragment: str) -> None:
    with pytest.raises(SimulationError, match=fragment):
        load_trace(name)


def test_unknown_itp_cluster(traces_dir: Path) -> None:
    with pytest.raises(SimulationError, match="unknown ITP cluster in 'itp:cluster42'"):
        load_trace("itp:cluster42", traces_dir)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("job_id,submit_s,duration_s\nj,0,1\n", "no column 'gpus'"),
        ("job_id,submit_s,duration_s,gpus,user\nj,0,1,1,x\n", "unknown column 'user'"),
        ("job_id,submit_s,duration_s,gpus\nj,soon,1,1\n", ":2: submit_s 'soon' is not a number"),
        ("job_id,submit_s,duration_s,gpus\nj,0,0,1\n", "duration_s must be positive"),
        ("job_id,submit_s,duration_s,gpus\nj,0,1,1\nj,1,1,1\n", "job id 'j' appears twice"),
        ("job_id,submit_s,duration_s,gpus\nj k,0,1,1\n", "job id 'j k' is not valid"),
    ],
)
def test_bad_csv_rows_name_the_line_and_value(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SimulationError, match=fragment):
        load_trace(str(path))


def test_bad_slices(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,submit_s,duration_s,gpus,project\na,0,1,1,x\n")
    trace = load_trace(str(path))
    with pytest.raises(SimulationError, match="--from: 'monday' is not a number of seconds"):
        select(trace, Slice(start="monday"))
    with pytest.raises(SimulationError, match="--projects: 'y' is not a project"):
        select(trace, Slice(projects=("y",)))
    with pytest.raises(SimulationError, match="--from 5 is after --to 1"):
        select(trace, Slice(start="5", end="1"))


def test_bad_philly_date(philly: Trace) -> None:
    with pytest.raises(SimulationError, match="--to: '2017-11-31' is not a date"):
        select(philly, Slice(end="2017-11-31"))


def test_traces_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRLANE_TRACES", str(tmp_path))
    assert find_traces_dir() == tmp_path
    monkeypatch.setenv("FAIRLANE_TRACES", str(tmp_path / "missing"))
    with pytest.raises(SimulationError, match=r"FAIRLANE_TRACES=.*missing: not a folder"):
        find_traces_dir()
    assert find_traces_dir(tmp_path) == tmp_path
