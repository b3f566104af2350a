"""Volumes: the allowlist's deciders, and admission's check of a job's mounts against it
(pure: a virtual cluster folds what the deciders decide)."""

from __future__ import annotations

import posixpath

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from events import JobAdmitted, JobRejected, JobSpec, ProjectTerms, VolumeGrant, VolumeMount
from events.commands import MAX_VOLUMES, AllowVolume, DenyVolume, SubmitJob, decode_command
from policy.commands.outcome import Accepted, Refused
from policy.commands.volumes import grant_for, is_under, mount_problems, normalized
from policy.snapshot import decode_snapshot, encode_snapshot
from simulation.virtual_cluster import VirtualCluster

PARTS = st.sampled_from(["data", "x", "..", ".", "", "data2", "d.."])
RELATIVE = st.lists(PARTS, max_size=6).map("/".join)


@pytest.fixture
def cluster() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("gpu")
    vc.add_node("g0", "gpu", 4)
    vc.set_project("team", {"gpu": ProjectTerms(quota=4)})
    return vc


def _allow(vc: VirtualCluster, prefix: str, read_write: bool = False) -> None:
    assert isinstance(vc.command(AllowVolume(host_prefix=prefix, read_write=read_write)), Accepted)


def _verdict(vc: VirtualCluster, *volumes: VolumeMount) -> JobAdmitted | JobRejected:
    verdict = vc.submit(f"j{len(vc.state.jobs)}", JobSpec(project="team", volumes=volumes))
    assert not isinstance(verdict, Refused)
    return verdict


@given(RELATIVE)
def test_normalized_refuses_dot_dot_and_matches_normpath_otherwise(relative: str) -> None:
    path = "/" + relative
    if ".." in path.split("/"):
        with pytest.raises(ValueError, match=r"climbs with '\.\.'") as refused:
            normalized("host path", path)
        assert repr(path) in str(refused.value)
        return
    clean = normalized("host path", path)
    assert clean == posixpath.normpath("/" + path.lstrip("/"))
    assert normalized("host path", clean) == clean


@given(RELATIVE, st.sampled_from(["/data", "/data/x", "/srv"]))
def test_a_mount_is_allowed_only_under_its_prefix_by_whole_parts(
    relative: str, prefix: str
) -> None:
    """Whatever a tenant writes after an allowed prefix, the mount is admitted only if its
    path, read without '..', is the prefix or inside it: never /data2 for /data, never a climb."""
    host = f"{prefix}/{relative}"
    grants = (VolumeGrant(prefix),)
    problem = mount_problems(JobSpec(project="p", volumes=(VolumeMount(host, "/in"),)), grants)
    if ".." in host.split("/"):
        assert problem is not None and "climbs" in problem
        return
    inside = posixpath.commonpath([posixpath.normpath(host), prefix]) == prefix
    assert (problem is None) == inside
    assert (grant_for(grants, normalized("h", host)) is not None) == inside


def test_is_under_takes_whole_parts() -> None:
    assert is_under("/data/x", "/data") and is_under("/data", "/data")
    assert not is_under("/data2", "/data") and not is_under("/dat", "/data")


def test_admission_names_the_volume_and_the_allowlist(cluster: VirtualCluster) -> None:
    refused = _verdict(cluster, VolumeMount("/data/a", "/in"))
    assert isinstance(refused, JobRejected)
    assert "volume /data/a:/in:ro" in refused.reason and "allowed: none" in refused.reason
    _allow(cluster, "/data/")
    assert isinstance(_verdict(cluster, VolumeMount("/data//a/.", "/in")), JobAdmitted)
    cases = [
        (VolumeMount("/etc", "/in"), "host path /etc is not under an allowed prefix"),
        (VolumeMount("/data/a", "/in", read_only=False), "/data is allowed read-only"),
        (VolumeMount("data/a", "/in"), "host path 'data/a' is not an absolute path"),
        (VolumeMount("/data/../etc", "/in"), "host path '/data/../etc' climbs"),
        (VolumeMount("/data/a", "/"), "the container path may not be /"),
        (VolumeMount("/data/a", "in"), "container path 'in' is not an absolute path"),
        (VolumeMount("/data/a\n", "/in"), "holds a control character"),
    ]
    for mount, fragment in cases:
        verdict = _verdict(cluster, mount)
        assert isinstance(verdict, JobRejected) and fragment in verdict.reason, mount
    twice = _verdict(cluster, VolumeMount("/data/a", "/in"), VolumeMount("/data/b", "/in/"))
    assert isinstance(twice, JobRejected) and "container path /in is given twice" in twice.reason


def test_the_most_specific_grant_decides_the_mode(cluster: VirtualCluster) -> None:
    _allow(cluster, "/data")
    _allow(cluster, "/data/scratch", read_write=True)
    writable = VolumeMount("/data/scratch/me", "/s", read_only=False)
    assert isinstance(_verdict(cluster, writable), JobAdmitted)
    assert isinstance(_verdict(cluster, VolumeMount("/data/a", "/a", False)), JobRejected)
    _allow(cluster, "/data/scratch")  # allowed again: read-only now
    assert cluster.state.volumes == (VolumeGrant("/data"), VolumeGrant("/data/scratch"))
    assert isinstance(_verdict(cluster, writable), JobRejected)


def test_allow_and_deny_refuse_what_they_cannot_mean(cluster: VirtualCluster) -> None:
    for prefix, fragment in [
        ("/", "would let jobs mount the whole node"),
        ("//.", "would let jobs mount the whole node"),
        ("data", "host prefix 'data' is not an absolute path"),
        ("/data/../etc", "climbs"),
    ]:
        refused = cluster.command(AllowVolume(host_prefix=prefix))
        assert isinstance(refused, Refused) and fragment in refused.reason, prefix
    _allow(cluster, "/srv/b")
    _allow(cluster, "/srv/a", read_write=True)
    assert cluster.state.volumes == (VolumeGrant("/srv/a", True), VolumeGrant("/srv/b"))
    gone = cluster.command(DenyVolume(host_prefix="/srv/c"))
    assert isinstance(gone, Refused)
    assert "'/srv/c' is not allowed now (allowed: /srv/a (read-write), /srv/b" in gone.reason
    assert isinstance(cluster.command(DenyVolume(host_prefix="/srv/a/")), Accepted)
    state = cluster.state  # read anew: a check above narrowed `cluster.state.volumes` for mypy
    assert state.volumes == (VolumeGrant("/srv/b"),)
    restored, _ = decode_snapshot(encode_snapshot(cluster.state, 9))
    assert restored.volumes == cluster.state.volumes


def test_a_job_mounts_a_bounded_count() -> None:
    spec = JobSpec(
        project="p", volumes=tuple(VolumeMount("/d", f"/c{i}") for i in range(MAX_VOLUMES + 1))
    )
    data = msgspec.json.encode(SubmitJob(job_id="j", spec=spec))
    with pytest.raises(msgspec.ValidationError, match=r"\$\.spec\.volumes"):
        decode_command(data)
