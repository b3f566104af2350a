"""A tenant's workload against the cluster that runs it: a real `fairlane up` (as root, so each
job runs as a uid of its own), a job of project `victim`, and a job of project `tenant` that
tries, from inside its workload, each of the six ways in a security review found open
(tests/tenant/attack.py): every one is refused, and the victim runs on untouched."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import asyncpg
import pytest

from cluster.servers import Postgres, free_ports
from services.executor import docker, identity, runtime
from services.executor.docker import ContainerHost, container_config
from services.executor.identity import REFUSAL, WorkloadUser, job_user
from services.executor.runtime import Launch
from tests.test_embedded import port_flags

T = TypeVar("T", bound=Callable[..., object])

#: The cluster's tests: only root gives workloads users of their own (CI runs as root).
live = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root can switch users"),
    pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no /usr/bin/python3"),
]


def _live(test: T) -> T:
    for mark in live:
        test = mark(test)
    return test


SCRIPTS = Path(__file__).parent / "tenant"
#: An interpreter every user may run (the cluster's own may sit in root's home).
PYTHON = "/usr/bin/python3"


def fairlane(*args: str, data_dir: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    at = args.index("--") if "--" in args else len(args)  # after `--`: the job's command
    own = [*args[:at], "--data-dir", str(data_dir), *args[at:]]
    cmd = [sys.executable, "-m", "fairlane.cli", *own]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """Not pytest's folder (0700, which no workload's user may enter): one others may cross,
    as a cluster's data folder's parents are."""
    folder = Path(tempfile.mkdtemp(prefix="fairlane-tenant-"))
    folder.chmod(0o755)
    scripts = folder / "scripts"
    shutil.copytree(SCRIPTS, scripts)
    for path in (scripts, *scripts.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def results(base: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """One cluster; the victim's job running; the tenant's job's findings."""
    data = base / "fl"
    nats_port, api_port = free_ports(2)
    ports = ["--nats-port", str(nats_port), "--api-port", str(api_port)]
    fairlane("up", "--detach", "--gpus", "2", *ports, data_dir=data)
    try:
        for project in ("victim", "tenant"):  # the API may still be starting
            _eventually(functools.partial(_configured, data, project), f"project {project}")
        scripts = str(base / "scripts")
        submit = ["--gpus", "1", "--working-dir", scripts, "--", PYTHON]
        fairlane("submit", "victim", "--project", "victim", *submit, "victim.py", data_dir=data)
        state = data / "executor/checkpoints/victim/replica-0/state"
        _eventually(state.exists, "the victim's checkpoint")
        api = f"http://127.0.0.1:{api_port}"
        attack = ["attack.py", str(data), api, str(nats_port)]
        fairlane("submit", "attack", "--project", "tenant", *submit, *attack, data_dir=data)
        log = data / "executor/runs/attack/1.0.log"
        _eventually(lambda: "RESULTS " in _read(log), f"the tenant's findings in {log}")
        line = next(x for x in _read(log).splitlines() if x.startswith("RESULTS "))
        yield data, json.loads(line.removeprefix("RESULTS "))
    finally:
        fairlane("down", data_dir=data, check=False)


def _configured(data: Path, project: str) -> bool:
    done = fairlane("project", "set", project, "--quota", "1", data_dir=data, check=False)
    return done.returncode == 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _eventually(condition: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {within}s")
        time.sleep(0.2)


@_live
def test_the_workload_runs_as_its_jobs_own_user(results: tuple[Path, dict[str, object]]) -> None:
    _, got = results
    assert got["uid"] == job_user("attack").uid != job_user("victim").uid
    # what is its own stays usable
    assert got["own_checkpoint"].startswith("GOT")  # type: ignore[attr-defined]
    assert got["own_home"].startswith("GOT")  # type: ignore[attr-defined]
    assert got["own_endpoint"] == "GOT 'HTTP/1.1 400 Bad Request'"  # its token taken, body not


@_live
def test_1_admin_token_and_credentials_unreadable(results: tuple[Path, dict[str, object]]) -> None:
    _, got = results
    for attempt in ("admin_token", "credentials_listed", "admin_credentials", "data_listed"):
        assert got[attempt] == "PermissionError", attempt
    assert got["cluster_file"] == "PermissionError"  # it holds PostgreSQL's DSN


@_live
def test_2_api_refuses_it_the_victims_cancel_and_a_quota(
    results: tuple[Path, dict[str, object]],
) -> None:
    data, got = results
    assert got["api_cancel"] == "HTTP 401"
    assert got["api_quota"] == "HTTP 401"
    jobs = fairlane("list", "-o", "json", data_dir=data).stdout
    assert any(j["job_id"] == "victim" and j["state"] == "running" for j in json.loads(jobs))


@_live
def test_3_nats_as_the_executor_refused(results: tuple[Path, dict[str, object]]) -> None:
    _, got = results
    assert got["executor_credentials"] == "PermissionError"
    assert "Authorization Violation" in str(got["nats_as_executor"])


@_live
def test_4_postgres_needs_a_password(results: tuple[Path, dict[str, object]]) -> None:
    data, got = results
    assert got["postgres_password"] == "PermissionError"
    assert got["postgres_socket"] == "PermissionError"
    # and where the socket is reached (here by root), nothing gets in without the password
    socket_dir = data / "postgres"

    async def connect(password: str | None) -> None:
        dsn = f"postgresql://postgres@/postgres?host={socket_dir}"
        conn = await asyncpg.connect(dsn, password=password)
        await conn.close()

    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(connect(None))
    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(connect("guessed"))
    asyncio.run(connect((data / "postgres.password").read_text().strip()))


@_live
def test_5_another_tenants_output_and_checkpoint_refused(
    results: tuple[Path, dict[str, object]],
) -> None:
    data, got = results
    for attempt in (
        "victim_output",
        "victim_checkpoint_read",
        "victim_checkpoint_write",
        "victim_home",
    ):
        assert got[attempt] == "PermissionError", attempt
    state = data / "executor/checkpoints/victim/replica-0/state"
    assert state.read_text() == "victim's state"


@_live
def test_6_another_attempts_token_unreadable(results: tuple[Path, dict[str, object]]) -> None:
    _, got = results
    environ = got["victim_environ"]
    assert isinstance(environ, dict)
    assert environ["readable"] == 0 and environ["refused"] > 0
    assert got["records"] == "PermissionError"  # the executor's records hold the tokens


def test_a_container_runs_as_its_jobs_user_with_its_own_folders_only() -> None:
    launch = Launch(
        job_id="j",
        attempt=1,
        replica=0,
        gpus=(),
        command=("python3", "train.py"),
        image="trainer:1",
        env={},
        checkpoint_dir=Path("/data/executor/checkpoints/j/replica-0"),
        run_dir=Path("/data/executor/runs/j"),
    )
    user = job_user("j")
    on = ContainerHost((), "host", (Path("/data/executor/endpoint"),), user)
    config = container_config(launch, "n1", None, on)
    host = config["HostConfig"]
    assert config["User"] == f"{user.uid}:{user.gid}"
    assert host["Privileged"] is False and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Binds"] == [
        "/data/executor/checkpoints/j/replica-0:/data/executor/checkpoints/j/replica-0",
        "/data/executor/endpoint:/data/executor/endpoint",  # the events socket's folder
    ]
    assert "User" not in container_config(launch, "n1", None, ContainerHost(()))


def process_launch(
    folder: Path, job_id: str, command: tuple[str, ...], env: dict[str, str] | None = None
) -> Launch:
    """Replica 0 of attempt 1 of `job_id`, its folders under `folder`."""
    return Launch(
        job_id=job_id,
        attempt=1,
        replica=0,
        gpus=(),
        command=command,
        image=None,
        env=env or {},
        checkpoint_dir=folder / f"checkpoints/{job_id}/replica-0",
        run_dir=folder / f"runs/{job_id}",
    )


def closed_python(folder: Path, script: str) -> Path:
    """An interpreter (`script`, a shell script) in a folder closed to other users, as a
    virtual environment under root's home is."""
    closed = folder / "closed"
    closed.mkdir(mode=0o700)
    python = closed / "python3"
    python.write_text(script)
    python.chmod(0o755)
    return python


async def test_an_executor_that_cannot_switch_users_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root and no --insecure-same-user: the workload is not started and says why."""
    monkeypatch.setattr(runtime, "can_switch_users", lambda: False)
    ran = tmp_path / "ran"
    launch = process_launch(tmp_path, "j", ("touch", str(ran)))
    workload = await runtime.ProcessRuntime(same_user=False).start(launch, "n1", None)
    assert await workload.wait() == 126
    assert workload.failure == REFUSAL and "--insecure-same-user" in REFUSAL
    assert not ran.exists()


async def test_a_builtin_workload_its_user_cannot_run_is_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in workload runs the executor's interpreter, else the system's: where both
    are closed to other users (root's home; no system Python) that is said, not left to fail
    as "Permission denied"."""
    monkeypatch.setattr(runtime, "can_switch_users", lambda: True)
    monkeypatch.setattr(identity, "SYSTEM_PYTHONS", (str(tmp_path / "none/python3"),))
    python = closed_python(tmp_path, "#!/bin/sh\n")
    rt = runtime.ProcessRuntime(python=str(python), same_user=False)
    workload = await rt.start(process_launch(tmp_path, "j", ()), "n1", None)
    assert await workload.wait() == 126
    assert workload.failure is not None and "cannot run" in workload.failure


@_live
async def test_a_builtin_workload_runs_on_the_systems_python_where_ours_is_closed(
    base: Path,
) -> None:
    """As root, with the executor's interpreter in a folder closed to other users (a virtual
    environment under root's home), the built-in workload runs on the system's Python as the
    job's own user, finding its code where the executor does: the README's walk-through as
    root failed its first job with exit 126."""
    folder = base / "builtin"
    folder.mkdir()
    folder.chmod(0o755)  # as `base`: others pass through, whatever the umask
    # the shim runs on it as root, as on the executor's own
    python = closed_python(folder, f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    checkpoints = folder / "checkpoints/builtin/replica-0"
    env = {"FAIRLANE_CHECKPOINT_DIR": str(checkpoints), "FAIRLANE_ATTEMPT": "1"}
    launch = process_launch(folder, "builtin", (), env)  # no command: the built-in one
    rt = runtime.ProcessRuntime(python=str(python), same_user=False)
    workload = await rt.start(launch, "n1", None)
    saved = checkpoints / "state.json"
    for _ in range(200):  # its first save comes after its first steps
        if saved.exists() or not workload.alive():
            break
        await asyncio.sleep(0.05)
    (checkpoints / ".exit").write_text("0\n")  # as the live engine completes a job
    assert await workload.wait() == 0, workload.failure
    assert workload.failure is None
    assert saved.stat().st_uid == job_user("builtin").uid  # it ran as the job's user
    assert "training: attempt 1, from step 0" in launch.log_file.read_text()


def test_a_container_runs_as_the_jobs_uid_as_root_else_the_executors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its mounts are all a container reaches of the node: without root (the compose
    deployment's executor) it runs as the executor's uid rather than being refused."""
    launch = Launch("j", 1, 0, (), ("true",), "img", {}, Path("/c/j/replica-0"), Path("/r/j"))
    monkeypatch.setattr(docker, "can_switch_users", lambda: True)
    assert docker.DockerRuntime(same_user=False).user(launch) == job_user("j")
    monkeypatch.setattr(docker, "can_switch_users", lambda: False)
    own = WorkloadUser(os.getuid(), os.getgid())
    assert docker.DockerRuntime(same_user=False).user(launch) == own
    assert docker.DockerRuntime(same_user=True).user(launch) is None


@_live
async def test_a_workload_whose_folders_its_user_cannot_reach_is_refused_clearly(
    base: Path,
) -> None:
    """A folder above the executor's closed to other users (a data folder under root's home,
    0700) would leave the job's user unable to enter its checkpoint folder: that is said,
    naming the folder, not left to fail in the workload as "Permission denied"."""
    (base / "walled").mkdir()
    (base / "walled").chmod(0o755)  # as `base`: others pass through, whatever the umask
    closed = base / "walled" / "home"
    closed.mkdir(mode=0o700)
    ran = base / "walled" / "ran"
    launch = process_launch(closed / "executor", "j", ("touch", str(ran)))
    workload = await runtime.ProcessRuntime(same_user=False).start(launch, "n1", None)
    assert await workload.wait() == 126
    assert workload.failure == identity.walled_off(closed)
    assert f"chmod o+x {closed}" in workload.failure
    assert not ran.exists()


@_live
def test_a_job_drained_to_a_second_node_resumes_there_as_its_own_user(
    base: Path,
) -> None:
    """A second node of an embedded cluster keeps its folder under `nodes/`: each job's user
    must pass through it. A job checkpointed on the first node, drained, resumes on the second
    from the checkpoint the first stored: as its own uid it could not enter its folder there
    (found on a GPU machine, where the moved job failed with "Permission denied")."""
    data = base / "moves"
    ports = port_flags()
    fairlane("up", "--detach", "--gpus", "1", "--nodes", "2", *ports, data_dir=data)
    try:
        nodes = json.loads(fairlane("nodes", "-o", "json", data_dir=data).stdout)
        first, second = sorted(n["node"] for n in nodes)
        _eventually(functools.partial(_configured, data, "mover"), "project mover")
        fairlane("node", "cordon", second, data_dir=data)
        fairlane("submit", "moved", "--project", "mover", "--gpus", "1", data_dir=data)
        saved = data / "executor/checkpoints/moved/replica-0/state.json"
        _eventually(saved.exists, "the first attempt's checkpoint")
        fairlane("node", "uncordon", second, data_dir=data)
        fairlane("node", "drain", first, data_dir=data)
        log = data / f"nodes/{second}/executor/runs/moved/2.0.log"
        _eventually(lambda: "training: attempt 2" in _read(log), f"attempt 2 in {log}")
        step = int(_read(log).split("training: attempt 2, from step ")[1].split()[0])
        assert step > 0  # resumed from the checkpoint, not from the start
        for folder in (data / "nodes", data / "nodes" / second):
            assert folder.stat().st_mode & 0o777 == 0o711  # passed through, never listed
        job = json.loads(fairlane("describe", "moved", "-o", "json", data_dir=data).stdout)
        assert (job["state"], job["attempt"], job["nodes"]) == ("running", 2, [second])
    finally:
        fairlane("down", data_dir=data, check=False)


@_live
async def test_postgres_as_root_lets_others_pass_the_folders_above_and_list_none() -> None:
    """The PostgreSQL wheel's server runs as a user of its own where we are root; the wheel
    made every folder up to `/` listable by everyone for it (a home folder of 0700 became
    0755). Its user needs only to pass through them."""
    folder = Path(tempfile.mkdtemp(prefix="fairlane-pg-"))
    try:
        home = folder / "home"
        home.mkdir(mode=0o700)
        server = Postgres(home / "cluster" / "postgres")
        await server.start()
        try:
            assert home.stat().st_mode & 0o777 == 0o711
            assert folder.stat().st_mode & 0o777 == 0o711  # mkdtemp's 0700, passed through
        finally:
            await server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
