"""The scenario parser is strict: every mistake is an error that names file, step and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulation.scenario.runner import run_file
from simulation.spec import ScenarioError, load_scenario

HEADER = """
name: t
pools: [{name: default, nodes: [{name: n0, gpus: 8}]}]
projects: [{name: a, quota: 4}]
"""


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ("steps:\n  - submit: {id: j, project: a, gpu: 1}\n", ["step 1", "unknown key 'gpu'"]),
        (
            "steps:\n  - submitt: {id: j, project: a}\n",
            ["step 1", "unknown key 'submitt'; allowed: 'add_node', 'advance'"],
        ),
        ("steps:\n  - complete: nope\n", ["step 1", "unknown job id 'nope'"]),
        (
            "steps:\n  - submit: {id: j, project: a}\n  - expect: {running: [j, k]}\n",
            ["step 2", "running", "unknown job id 'k'"],
        ),
        ("steps:\n  - submit: {id: j, project: a, gpus: -1}\n", ["gpus", "must be 0 or more"]),
        ("steps:\n  - advance: soon\n", ["step 1", "not a duration"]),
        (
            "steps:\n  - submit: {id: j, project: a, replicas: 2, min_replicas: 3}\n",
            ["min_replicas", "more than replicas"],
        ),
        ("steps:\n  - expect: {stable: yes}\n", ["stable", "expected true or false"]),
        ("steps:\n  - remove_node: n9\n", ["unknown node 'n9'"]),
        (
            "steps:\n  - submit: {id: j, project: a}\n  - submit: {id: j, project: a}\n",
            ["already submitted"],
        ),
        ("steps: []\nextra: 1\n", ["unknown key 'extra'"]),
        (
            "steps:\n  - submit: [{id: j, project: a}, {id: k, project: a, gpus: x}]\n",
            ["step 1 submit #2 gpus", "expected a whole number, got 'x'"],
        ),
        ("steps:\n  - submit: {id: 'a b', project: a}\n", ["not a valid name", "got 'a b'"]),
        ("config: {scheduler: {kind: fifo}}\nsteps: []\n", ["config scheduler", "key 'kind'"]),
        ("steps:\n  - {advance: 1m, expect: {}}\n", ["step 1", "exactly one key"]),
    ],
)
def test_mistakes_are_named(tmp_path: Path, body: str, fragments: list[str]) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_durations_are_read_as_everywhere_else(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "steps:\n  - submit: {id: j, project: a, min_runtime: 1h30m, duration: 1d}\n"
        "  - advance: 45\n",
    )
    scenario = load_scenario(path)
    spec = scenario.steps[0].value[0].spec
    assert (spec.min_runtime_s, spec.duration_s, scenario.steps[1].value) == (5400, 86400, 45)


def test_yaml_1_2_words_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\npools: [{name: default, nodes: [{name: n0, gpus: 1}]}]\n"
        "projects: [{name: a}]\nsteps:\n  - submit: {id: on, project: a}\n"
        "  - expect: {running: [on]}\n"
    )
    scenario = load_scenario(path)
    assert scenario.steps[0].value[0].id == "on"
    assert run_file(path).verdict == "pass"


def test_a_failed_expectation_reports_expected_and_observed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "steps:\n  - submit: {id: j, project: a, gpus: 8}\n"
        "  - expect: {pending: [j], usage: {a: 3}}\n",
    )
    result = run_file(path)
    assert result.verdict == "fail"
    assert any("j expected pending, observed running" in p for p in result.problems)
    assert any("expected 3, observed 8" in p for p in result.problems)


def test_unreadable_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    result = run_file(tmp_path / "missing.yaml")
    assert result.verdict == "error"
    assert "cannot read" in result.reason
