"""`fairlane submit`: a job from flags, a file or both, through the HTTP API."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

import cyclopts

from fairlane.api_options import Connection, connected
from fairlane.client import (
    CliError,
    project_or_fail,
)
from fairlane.output import (
    USAGE,
    MaybeGpus,
    MaybeSeconds,
    MaybeWhole,
    Output,
    emit,
    errors_said,
    fail,
    flags_named,
    said,
)
from fairlane.volumes_cli import parse_volume

#: The flag of each submit request field not spelt `--field-name` (for errors that name it).
#: The longest `--working-dir` (PATH_MAX; the API's and the services' bound too).
MAX_WORKING_DIR: Final = 4096
SUBMIT_FLAGS = {
    "job_id": "JOB",
    "pools": "--pool",
    "preemption_delay_s": "--preemption-delay",
    "min_runtime_s": "--min-runtime",
    "grace_s": "--grace",
    "ports": "--port",
    "volumes": "--volume",
    "working_dir": "--working-dir",
}


def submit(
    job_id: str | None = None,
    /,
    *workload: str,
    file: Annotated[Path | None, cyclopts.Parameter(name=["--file", "-f"])] = None,
    project: str | None = None,
    job_class: Annotated[str | None, cyclopts.Parameter(name="--class")] = None,
    priority: MaybeWhole = None,
    gpus: MaybeGpus = None,
    replicas: MaybeWhole = None,
    min_replicas: MaybeWhole = None,
    pool: list[str] | None = None,
    node: str | None = None,
    image: str | None = None,
    command: list[str] | None = None,
    env: Annotated[list[str] | None, cyclopts.Parameter(name=["--env", "-e"])] = None,
    preemptible: bool | None = None,
    preemption_delay: MaybeSeconds = None,
    min_runtime: MaybeSeconds = None,
    grace: MaybeSeconds = None,
    working_dir: str | None = None,
    port: list[str] | None = None,
    volume: list[str] | None = None,
    idempotency_key: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Submit a job.

    Everything after `--` is the workload's command, dash-led arguments included:

    ```
    fairlane submit train-1 --project team-a --class train --gpus 2 -- python3 train.py --lr 0.1
    fairlane submit -f job.yaml --gpus 4
    ```

    A job spec file (-f) holds the same fields as the flags, spelt as they are (`name` for the
    job's name): `name: train-1`, `gpus: 2`, `command: [python3, train.py]`, `env: {A: "1"}`.
    Flags given as well win over the file.

    Parameters
    ----------
    job_id
        A unique name: letters, digits, '-' and '_' (or `name` in the file).
    file
        A job spec in YAML: the same fields as the flags.
    workload
        The workload's command and its arguments (after `--`); default: the built-in workload.
    project
        The project (team) the job belongs to (default: FAIRLANE_PROJECT, else `project:` in
        the config file, as `fairlane login --project` saves it).
    job_class
        Priority class: train, interactive, build, inference (or the cluster's own).
    priority
        An explicit priority instead of a class (higher is more important).
    gpus
        Whole GPUs per replica (0: CPU only; default 1).
    replicas
        Replicas, placed together as one gang (default 1).
    min_replicas
        Fewer than replicas makes the job elastic.
    pool
        Pools to try in order (repeat the flag).
    node
        Run only on this node.
    image
        The container image the command runs in (nodes whose executor runs `--runtime docker`;
        refused where the nodes run processes, as `fairlane up` starts them by default).
    command
        The workload's command, one flag per argument (or give it after `--`).
    env
        KEY=VALUE for the workload's environment (repeat the flag).
    preemptible
        Whether it may be preempted (default: from its class).
    preemption_delay
        How long it waits pending before it may preempt others: seconds, or 90s, 10m, 1h30m.
    min_runtime
        How long it runs before it may be preempted: seconds, or 90s, 10m, 1h30m.
    grace
        How long between SIGTERM and SIGKILL when it is stopped (default: the cluster's):
        seconds, or 90s, 10m.
    working_dir
        The folder the workload runs in on its node (its checkpoint folder is only named in
        FAIRLANE_CHECKPOINT_DIR). Default: with no --image and the cluster on this machine,
        the folder `submit` is run in; with an image, the image's own.
    port
        HOST:CONTAINER (or PORT for both): each replica publishes it on its node, shown as a
        URL by describe and list (repeat the flag). A job waits for a node where its host
        ports are free.
    volume
        HOST:CONTAINER[:ro|rw] (or HOST for the same path): a folder of the node each replica's
        container sees, read-only unless `:rw` (repeat the flag). Only under the folders an
        admin allows (`fairlane volumes list`); refused where the nodes run processes.
    idempotency_key
        Submitting again with the same key returns the first answer instead of a second job.
    """
    given: dict[str, Any] = {}
    with errors_said():
        if file is not None:
            from fairlane.job_file import job_fields  # noqa: PLC0415 (msgspec, YAML: slow)

            given = job_fields(file)
        job_id = job_id or given.get("name")
        if not job_id:
            raise CliError("name the job: submit NAME, or `name:` in the file (-f)", USAGE)
        project = project or given.get("project") or project_or_fail()
    argv = [*(command or ()), *workload] or _as_list(given.get("command"))
    body: dict[str, Any] = {
        "job_id": job_id,
        "project": project,
        "gpus": _first(gpus, given.get("gpus"), 1),
        "replicas": _first(replicas, given.get("replicas"), 1),
        "command": argv,
        "pools": pool or _as_list(given.get("pool")),
    }
    optional = {
        "class": _first(job_class, given.get("class")),
        "priority": _first(priority, given.get("priority")),
        "min_replicas": _first(min_replicas, given.get("min-replicas")),
        "node": _first(node, given.get("node")),
        "image": _first(image, given.get("image")),
        "preemptible": _first(preemptible, given.get("preemptible")),
        "preemption_delay_s": _first(preemption_delay, given.get("preemption-delay")),
        "min_runtime_s": _first(min_runtime, given.get("min-runtime")),
        "grace_s": _first(grace, given.get("grace")),
        "idempotency_key": _first(idempotency_key, given.get("idempotency-key")),
    }
    for field in ("preemption_delay_s", "min_runtime_s", "grace_s"):
        seconds = optional[field]
        if seconds is not None and not math.isfinite(seconds):
            # JSON has no NaN or infinity: sent, the API read the body as malformed ("invalid
            # character (byte 116)"), naming neither the flag nor the value
            fail(f"{SUBMIT_FLAGS[field]} {seconds}: give a finite number of seconds", USAGE)
    _check_replicas(body["replicas"], optional["min_replicas"])
    body.update({k: v for k, v in optional.items() if v is not None})
    from_file = given.get("env")
    if isinstance(from_file, dict):
        body["env"] = {str(k): str(v) for k, v in from_file.items()}
    elif from_file:
        env = [*_as_list(from_file), *(env or [])]
    if env:
        body["env"] = {**body.get("env", {}), **_environment(env)}
    if port:
        body["ports"] = _ports(port)
    volumes = [*_as_list(given.get("volume")), *(volume or [])]
    if volumes:
        body["volumes"] = [parse_volume(v) for v in volumes]
    sent = {**body, "volumes": volumes}  # (errors show the values as given)
    with errors_said(), connected(connection) as api, flags_named(sent, SUBMIT_FLAGS):
        folder = _working_dir(
            _first(working_dir, given.get("working-dir")),
            local=_on_this_machine(api.target.api),
            image=body.get("image"),
        )
        if folder is not None:
            body["working_dir"] = folder
        answer = api.post("/v1/jobs", body)
        emit(answer, output, lambda a: said(a, f"job {job_id}"))


def _check_replicas(replicas: object, min_replicas: object) -> None:
    """A usage error before anything is sent: admission would refuse the job (exit 1, as
    if the cluster had said no to a sound request)."""
    if not isinstance(replicas, int) or not isinstance(min_replicas, int):
        return  # a file's odd value: the API names its field
    if not 1 <= min_replicas <= replicas:
        fail(
            f"--min-replicas {min_replicas}: must be from 1 to --replicas ({replicas}); fewer than "
            "--replicas makes the job elastic",
            USAGE,
        )


LOCAL_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_PORT: Final = 65535


def _on_this_machine(api_url: str) -> bool:
    """Whether the API (so, for `fairlane up`, the whole cluster) runs on this machine."""
    return urlsplit(api_url).hostname in LOCAL_HOSTS


def _working_dir(given: str | None, local: bool, image: str | None) -> str | None:
    """The job's working directory: checked here where the nodes share this machine's
    folders, before anything is sent (elsewhere the node's executor says so if it is not
    there)."""
    if given is None:
        return os.getcwd() if local and image is None else None
    if len(given) > MAX_WORKING_DIR:
        fail(f"--working-dir is longer than {MAX_WORKING_DIR} characters", USAGE)
    if not local:
        if not given.startswith("/"):
            fail(f"--working-dir must be an absolute path on the nodes, got {given!r}", USAGE)
        return given
    folder = Path(given).expanduser().absolute()
    if not folder.is_dir():
        fail(f"--working-dir {given!r}: no such directory on this machine", USAGE)
    return str(folder)


def _first(*values: Any) -> Any:
    """The first value given (a flag's, then the file's, then a default)."""
    return next((v for v in values if v is not None), None)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _environment(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            fail(f"--env takes KEY=VALUE, got {pair!r}", USAGE)
        env[key] = value
    return env


def _ports(given: list[str]) -> list[dict[str, int]]:
    """`--port HOST:CONTAINER` or `--port PORT`, each a number in 1..65535, no host port
    twice (a node publishes it once)."""
    ports: list[dict[str, int]] = []
    for value in given:
        host, colon, container = value.partition(":")
        try:
            pair = (int(host), int(container) if colon else int(host))
        except ValueError:
            fail(f"--port takes HOST:CONTAINER or PORT, got {value!r}", USAGE)
        if not all(1 <= p <= MAX_PORT for p in pair):
            fail(f"--port {value!r}: ports are between 1 and {MAX_PORT}", USAGE)
        if any(p["host"] == pair[0] for p in ports):
            fail(f"--port {value!r}: host port {pair[0]} is given twice", USAGE)
        ports.append({"host": pair[0], "container": pair[1]})
    return ports
