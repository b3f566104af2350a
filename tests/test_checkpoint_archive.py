"""A replica's checkpoint folder as the object store carries it: packed into a tar, unpacked
beside the node's folder and swapped in; refused whole when a member would land outside it.
Also on a Python without tarfile's `data` filter (before 3.11.4, such as Debian 12's python3,
which the compose test's images run), where the same guard is done by hand."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from services.executor.storage import pack, unpack

WITH_AND_WITHOUT_FILTER = pytest.mark.parametrize("data_filter", [True, False])


def use_filter(monkeypatch: pytest.MonkeyPatch, data_filter: bool) -> None:
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)


def contents(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@WITH_AND_WITHOUT_FILTER
def test_a_packed_folder_replaces_the_nodes_folder_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool
) -> None:
    saved = tmp_path / "a" / "replica-0"
    (saved / "shards").mkdir(parents=True)
    (saved / "train.json").write_text('{"step": 40}')
    (saved / "shards" / "0.bin").write_bytes(b"\x00" * 3000)
    (saved / ".checkpoint").touch()  # a control file: not part of the checkpoint
    (saved / "train.json").chmod(0o4777)  # setuid and writable by all: not carried over
    archive = tmp_path / "replica-0.tar"
    pack(saved, archive)

    use_filter(monkeypatch, data_filter)
    here = tmp_path / "b" / "replica-0"
    here.mkdir(parents=True)
    (here / "stale.json").write_text("from an older attempt")
    unpack(archive, here)
    assert contents(here) == {"shards/0.bin": b"\x00" * 3000, "train.json": b'{"step": 40}'}
    mode = stat.S_IMODE((here / "train.json").stat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH), oct(mode)
    assert sorted(p.name for p in here.parent.iterdir()) == ["replica-0"]  # nothing beside it


def archive_of(member: tarfile.TarInfo, into: Path) -> Path:
    with tarfile.open(into, "w") as tar:
        tar.addfile(member, io.BytesIO(b"x") if member.isfile() else None)
    return into


def file_named(name: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.size = 1
    return member


@WITH_AND_WITHOUT_FILTER
@pytest.mark.parametrize("name", ["../evil", "shards/../../evil"])
def test_a_member_outside_the_folder_is_refused_and_the_folder_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool, name: str
) -> None:
    archive = archive_of(file_named(name), tmp_path / "bad.tar")
    use_filter(monkeypatch, data_filter)
    here = tmp_path / "node" / "replica-0"
    here.mkdir(parents=True)
    (here / "train.json").write_text('{"step": 7}')
    with pytest.raises((ValueError, tarfile.TarError)) as refused:
        unpack(archive, here)
    if not data_filter:
        assert f"checkpoint archive member {name!r} refused" in str(refused.value)
    assert contents(here) == {"train.json": b'{"step": 7}'}
    assert not (tmp_path / "evil").exists() and not (tmp_path / "node" / "evil").exists()


def test_without_the_filter_links_devices_and_absolute_names_are_refused_before_unpacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stricter than the filter, which keeps links inside the folder and makes an absolute
    name relative: a checkpoint is files and folders."""
    absolute = file_named("/etc/evil")
    link = tarfile.TarInfo("latest")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    device = tarfile.TarInfo("disk")
    device.type = tarfile.BLKTYPE
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    for i, member in enumerate((absolute, link, device)):
        archive = archive_of(member, tmp_path / f"{i}.tar")
        here = tmp_path / str(i) / "replica-0"
        here.mkdir(parents=True)
        with pytest.raises(ValueError, match=f"member '{member.name}' refused"):
            unpack(archive, here)
        assert list(here.parent.iterdir()) == [here]  # no half-unpacked folder beside it
