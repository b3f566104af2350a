"""Volumes: the host folders an admin lets jobs mount, and whether a job's mounts are among them.

Paths are read as text, the same on every machine: absolute, no `..` (a prefix check on a path
that may climb out of it would prove nothing), no control characters; `//` and `.` are
dropped, so `/data/./x/` is `/data/x`. Whether a path goes through a symlink only the node can
see: its runtime checks that as it mounts (services/executor/docker.py).

A mount is allowed when its host path is an allowed prefix or under one, by whole path parts
(`/data2` is not under `/data`); the longest such prefix decides whether it may be writable.
"""

from __future__ import annotations

from typing import Final

from events import JobSpec, VolumeGrant, VolumeMount, VolumesConfigured, ids
from events.commands import MAX_VOLUME_GRANTS, AllowVolume, DenyVolume
from policy.commands.outcome import Accepted, Outcome, refuse
from policy.state import ClusterState

#: Refused as a prefix: it would hand a job the whole node (the Docker socket, credentials).
ROOT: Final = "/"


def normalized(what: str, path: str) -> str:
    """`path` with `//` and `.` parts dropped; ValueError, naming `what` and the value, for a
    path that is not absolute, climbs with `..`, or holds a control character."""
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} is not an absolute path")
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise ValueError(f"{what} {path!r} holds a control character")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{what} {path!r} climbs with '..': give the path without it")
    return "/" + "/".join(parts)


def is_under(path: str, prefix: str) -> bool:
    """Whether normalized `path` is `prefix` or inside it, by whole parts."""
    return prefix in (ROOT, path) or path.startswith(prefix + "/")


def grant_for(grants: tuple[VolumeGrant, ...], host: str) -> VolumeGrant | None:
    """The most specific grant `host` (normalized) is under, or None."""
    under = [g for g in grants if is_under(host, g.prefix)]
    return max(under, key=lambda g: len(g.prefix), default=None)


def said(grants: tuple[VolumeGrant, ...]) -> str:
    """The allowlist in words, for a refusal."""
    if not grants:
        return "none: an admin allows host folders with `fairlane volumes allow`"
    return ", ".join(f"{g.prefix} ({_mode(g)})" for g in grants)


def _mode(grant: VolumeGrant) -> str:
    return "read-write" if grant.read_write else "read-only"


def mount_problems(spec: JobSpec, grants: tuple[VolumeGrant, ...]) -> str | None:
    """Why the job's volumes may not be mounted (the first reason), or None."""
    seen: set[str] = set()
    for v in spec.volumes:
        mode = "ro" if v.read_only else "rw"
        about = f"volume {v.host}:{v.container}:{mode}"
        try:
            host = normalized(f"{about}: host path", v.host)
            container = normalized(f"{about}: container path", v.container)
        except ValueError as e:
            return str(e)
        if container == ROOT:
            return f"{about}: the container path may not be / (it would hide the image)"
        if container in seen:
            return f"{about}: container path {container} is given twice"
        seen.add(container)
        problem = _granted(about, host, v, grants)
        if problem is not None:
            return problem
    return None


def _granted(about: str, host: str, v: VolumeMount, grants: tuple[VolumeGrant, ...]) -> str | None:
    grant = grant_for(grants, host)
    if grant is None:
        return f"{about}: host path {host} is not under an allowed prefix (allowed: {said(grants)})"
    if not v.read_only and not grant.read_write:
        return (
            f"{about}: {grant.prefix} is allowed read-only; mount it with :ro "
            "(or an admin allows it with --read-write)"
        )
    return None


def allow(state: ClusterState, command: AllowVolume, now: float, at: int) -> Outcome:
    try:
        prefix = normalized("host prefix", command.host_prefix)
    except ValueError as e:
        return refuse("bad_volume", "host_prefix", problem=str(e))
    if prefix == ROOT:
        return refuse(
            "bad_volume",
            "host_prefix",
            problem="host prefix '/' would let jobs mount the whole node (its credentials, "
            "the Docker socket): allow the folders they need",
        )
    kept = [g for g in state.volumes if g.prefix != prefix]
    if len(kept) >= MAX_VOLUME_GRANTS:
        bound = f"hold at most {MAX_VOLUME_GRANTS} prefixes"
        return refuse(
            "out_of_range", "host_prefix", len(kept) + 1, what="the allowlist", bound=bound
        )
    grants = tuple(sorted([*kept, VolumeGrant(prefix, command.read_write)], key=_by_prefix))
    return Accepted((_configured(command.actor, grants, now, at),))


def deny(state: ClusterState, command: DenyVolume, now: float, at: int) -> Outcome:
    try:
        prefix = normalized("host prefix", command.host_prefix)
    except ValueError as e:
        return refuse("bad_volume", "host_prefix", problem=str(e))
    kept = tuple(g for g in state.volumes if g.prefix != prefix)
    if len(kept) == len(state.volumes):
        return refuse("not_allowed", "host_prefix", prefix, allowed=said(kept))
    return Accepted((_configured(command.actor, kept, now, at),))


def _by_prefix(grant: VolumeGrant) -> str:
    return grant.prefix


def _configured(
    actor: str, grants: tuple[VolumeGrant, ...], now: float, at: int
) -> VolumesConfigured:
    return VolumesConfigured(id=ids.volumes_configured(at), time=now, actor=actor, grants=grants)
