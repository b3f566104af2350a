"""A Docker engine and locally made images for the `docker` tests (no registry is reachable).

- The engine: `FAIRLANE_DOCKER_HOST` (default `unix:///run/fairlane-docker.sock`, the private
  engine `.ci/dockerd` starts). Missing: the tests skip, or fail with `CI=true`.
- The base image `fairlane-test/python:bookworm`: a minimal Debian with python3, made with
  debootstrap from the machine's own apt source and imported; the root filesystem's tarball is
  cached in `FAIRLANE_IMAGE_CACHE` (default /var/cache/fairlane) between runs.
- The example image: the base plus `fairlane/workload.py` and `examples/`, tagged with a hash
  of those files, so it is made again only when they change.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import aiodocker
import pytest
from aiodocker.exceptions import DockerError

REPO = Path(__file__).resolve().parent.parent
DOCKER_HOST = os.environ.get("FAIRLANE_DOCKER_HOST", "unix:///run/fairlane-docker.sock")
CACHE = Path(os.environ.get("FAIRLANE_IMAGE_CACHE", "/var/cache/fairlane"))
#: v2: its root folder is 0755 (the first was 0700, which locked out any non-root user)
BASE = "fairlane-test/python:bookworm-v2"
APT_SOURCE = os.environ.get("FAIRLANE_APT_SOURCE", "http://deb.debian.org/debian")
EXAMPLE_FILES = ("fairlane/workload.py", "examples/train.py", "examples/train_torch.py")


def missing(why: str) -> None:
    """A component the docker tests need is not there: fail in CI, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: run .ci/dockerd first)")
    pytest.skip(why)


async def engine() -> aiodocker.Docker:
    docker = aiodocker.Docker(url=DOCKER_HOST)
    try:
        await docker.version()
    except (DockerError, OSError) as e:
        await docker.close()
        missing(f"no Docker engine answers at {DOCKER_HOST}: {e}")
    return docker


async def has_image(docker: aiodocker.Docker, name: str) -> bool:
    try:
        await docker.images.inspect(name)
    except DockerError:
        return False
    return True


def base_tarball() -> Path:
    """The base root filesystem as a tarball, made once per machine."""
    tarball = CACHE / "bookworm-python3-rootfs-v2.tar"
    if tarball.exists():
        return tarball
    legacy = CACHE / "bookworm-python3-rootfs.tar"
    if legacy.exists():  # made before v2: the same files, its root folder opened up
        _open_root(legacy, tarball)
        return tarball
    if shutil.which("debootstrap") is None:
        missing("debootstrap is not installed (apt-get install debootstrap)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as root:
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3", "bookworm", root, APT_SOURCE],
            check=True,
            capture_output=True,
        )
        os.chmod(root, 0o755)  # a temporary folder is 0700: the image's / must not be
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", root, "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    return tarball


def _open_root(source: Path, target: Path) -> None:
    partial = target.with_suffix(".partial")
    with tarfile.open(source, "r|") as old, tarfile.open(partial, "w|", format=old.format) as new:
        for member in old:
            if member.name in (".", "./"):
                member.mode = 0o755
            new.addfile(member, old.extractfile(member) if member.isreg() else None)
    partial.rename(target)


async def base_image(docker: aiodocker.Docker) -> str:
    if not await has_image(docker, BASE):
        await asyncio.to_thread(import_base)
    return BASE


def import_base() -> None:
    with base_tarball().open("rb") as data:
        subprocess.run(
            ["docker", "-H", DOCKER_HOST, "import", "-", BASE],
            stdin=data,
            check=True,
            capture_output=True,
        )


def _context() -> tuple[bytes, str]:
    """The example image's build context as a tar, and a hash of what goes in it."""
    dockerfile = (
        f"FROM {BASE}\n"
        "COPY fairlane /app/fairlane\n"
        "COPY examples /app/examples\n"
        "ENV PYTHONPATH=/app PYTHONUNBUFFERED=1\n"
    ).encode()
    digest = hashlib.sha256(dockerfile)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        files = {"Dockerfile": dockerfile, "fairlane/__init__.py": b""}
        for name in EXAMPLE_FILES:
            files[name] = (REPO / name).read_bytes() if (REPO / name).exists() else b""
        for name, content in sorted(files.items()):
            digest.update(name.encode() + content)
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue(), digest.hexdigest()[:12]


async def example_image(docker: aiodocker.Docker) -> str:
    """The base with the workload module and the examples in /app."""
    await base_image(docker)
    context, digest = _context()
    name = f"fairlane-test/example:{digest}"
    if not await has_image(docker, name):
        await docker.images.build(fileobj=io.BytesIO(context), encoding="identity", tag=name)
        if not await has_image(docker, name):
            raise RuntimeError(f"building {name} did not make it")
    return name
