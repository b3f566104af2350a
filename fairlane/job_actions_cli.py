"""What a user does to jobs, through the HTTP API: delete, update (priority), pause and
resume."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import cyclopts
from rich.markup import escape

from fairlane.api_options import Connection, connected
from fairlane.client import Api, ApiError, CliError, closest, named, project_or_fail
from fairlane.jobs_cli import listed
from fairlane.output import (
    USAGE,
    MaybeWhole,
    Output,
    emit,
    err,
    errors_said,
    fail,
    flags_named,
    said,
)


def _command(api: Api, job_id: str, verb: str) -> dict[str, Any]:
    """Delete, pause or resume a job: the API's answer; an unknown job's error names the
    closest job names."""
    named("JOB", job_id)
    try:
        if verb == "delete":
            answer: dict[str, Any] = api.delete(f"/v1/jobs/{job_id}")
        else:
            answer = api.post(f"/v1/jobs/{job_id}/{verb}")
    except ApiError as e:
        if e.status == 404 and e.field == "job_id":
            raise CliError(f"{e}{closest(job_id, api.job_names())}") from None
        raise
    return answer


def _act(job_id: str, verb: str, connection: Connection | None, output: Output) -> None:
    with errors_said(), connected(connection) as api:
        answer = _command(api, job_id, verb)
        emit(answer, output, lambda a: said(a, f"job {job_id}"))


#: States from which a job will not run again: `delete --all` leaves them be.
FINISHED = frozenset({"completed", "failed", "cancelled", "rejected"})


def delete(
    *job_ids: Annotated[str, cyclopts.Parameter(name="JOB")],
    all_jobs: Annotated[bool, cyclopts.Parameter(name="--all", negative="")] = False,
    project: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Delete (cancel) jobs; running ones are stopped.

    ```
    fairlane delete train-1 train-2
    fairlane delete --all --project team-a
    ```

    With -o json or yaml: each deletion's answer, in order.

    Parameters
    ----------
    job_ids
        The jobs to delete.
    all_jobs
        Every job of the project that has not finished (--project, else the default project).
    project
        With --all: the project (default: FAIRLANE_PROJECT, else `project:` in the config).
    """
    if all_jobs == bool(job_ids):
        fail("name the jobs to delete, or give --all (with --project)", USAGE)
    if project is not None and not all_jobs:
        fail("--project goes with --all; named jobs are deleted whatever their project", USAGE)
    with errors_said():
        for job_id in job_ids:  # all checked before the first is deleted
            named("JOB", job_id)
    with errors_said(), connected(connection) as api:
        if all_jobs:
            project = project or project_or_fail()
            with flags_named({"project": project}):
                found = listed(api, 10_000, project=project)
            job_ids = tuple(j["job_id"] for j in found if j["state"] not in FINISHED)
            if not job_ids:
                err.print(f"project {escape(project)} has no job left to delete")
        answers: list[dict[str, Any]] = []
        failed: list[str] = []
        for job_id in job_ids:
            try:
                answers.append(_command(api, job_id, "delete"))
            except CliError as e:  # say so and go on with the others
                err.print(f"[red]error:[/] job {escape(job_id)}: {escape(str(e))}")
                failed.append(job_id)
        emit(answers, output, _all_said)
    if failed:
        sys.exit(1)


def _all_said(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        said(answer, f"job {answer.get('event', {}).get('job_id', '')}")


def update(
    job_id: str,
    /,
    *,
    priority: MaybeWhole = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Change a waiting or running job: its priority (the policy weighs it from its next
    cycle on; higher is more important).

    ```
    fairlane update train-1 --priority 80
    ```

    Parameters
    ----------
    priority
        The job's new priority.
    """
    if priority is None:
        fail("say what to change: --priority N", USAGE)
    body = {"priority": priority}
    with errors_said(), connected(connection) as api, flags_named(body):
        try:
            answer = api.patch(f"/v1/jobs/{named('JOB', job_id)}", body)
        except ApiError as e:
            if e.status == 404 and e.field == "job_id":
                raise CliError(f"{e}{closest(job_id, api.job_names())}") from None
            raise
        emit(answer, output, lambda a: said(a, f"job {job_id}"))


def pause(
    job_id: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Pause a job: it checkpoints, gives its GPUs back and waits until resumed.

    fairlane pause train-1
    """
    _act(job_id, "pause", connection, output)


def resume(
    job_id: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Resume a paused job: it queues again for GPUs.

    fairlane resume train-1
    """
    _act(job_id, "resume", connection, output)
