"""Reading events written by any version of Fairlane: the one place that decodes them.

- An event of an older schema version is upcast before it is decoded: its fields are turned,
  one version step at a time, into the current version's (`UPCASTERS`).
- A field this code does not know (written by a newer version) is ignored, never an error:
  the structs do not forbid unknown fields.
- A message whose type this code knows but cannot decode is `Undecodable`: a reader must stop
  there, not skip it, or its fold would silently differ from everyone else's.
- Anything else (not JSON, no type, a type this code does not know) is `NotAnEvent`: garbage,
  which readers count and skip.

Upcasting costs a second decode, so only the types whose fields changed since version 1 pay
it (`RESHAPED`); every other type decodes once, straight into its struct.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, get_args

import msgspec

from events.catalogue import SCHEMA_VERSION, AnyEvent

Fields = dict[str, Any]
Upcaster = Callable[[Fields], Fields]


class NotAnEvent(ValueError):
    """Bytes that are no event of a type this code knows: count and skip them."""


class Undecodable(RuntimeError):
    """An event of a known type that this code cannot read: stop reading there."""


def _cluster_settings_as_one(fields: Fields) -> Fields:
    """ClusterConfigured 1 -> 2: the settings move from the event into `settings`."""
    names = (
        "scheduler",
        "preemption_grace_s",
        "priority_classes",
        "default_compute_pool",
        "default_aux_pool",
    )
    settings = {name: fields.pop(name) for name in names if name in fields}
    if not settings.get("priority_classes", True):
        del settings["priority_classes"]  # version 1 said "the defaults" with an empty list
    return {**fields, "settings": settings}


#: (event type, version) -> the step from that version to the next.
UPCASTERS: Final[dict[tuple[str, int], Upcaster]] = {
    ("ClusterConfigured", 1): _cluster_settings_as_one,
}
#: The event types whose fields changed since version 1.
RESHAPED: Final = frozenset(kind for kind, _ in UPCASTERS)
KNOWN_TYPES: Final = frozenset(t.__name__ for t in get_args(AnyEvent))
_RESHAPED_TYPES: Final = frozenset(t for t in get_args(AnyEvent) if t.__name__ in RESHAPED)


class _Envelope(msgspec.Struct):
    type: str
    version: int = 1  # events written before versions were written are version 1


_decoder: Final[msgspec.json.Decoder[AnyEvent]] = msgspec.json.Decoder(AnyEvent)
_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)
_fields_decoder: Final = msgspec.json.Decoder(dict[str, Any])


def decode_event(data: bytes | memoryview) -> AnyEvent:
    """The event in `data`, upcast to the current version. Raises `NotAnEvent` for garbage
    and `Undecodable` for a known type that cannot be read."""
    try:
        event = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _failure(data, e) from None
    if type(event) in _RESHAPED_TYPES:
        return _upcast(data)
    return event


def upcast(fields: Fields) -> Fields:
    """An event's fields as the current version has them (`fields` is left as it is)."""
    kind, version = fields.get("type"), fields.get("version", 1)
    while version < SCHEMA_VERSION:
        step = UPCASTERS.get((str(kind), version))
        if step is not None:
            fields = step(dict(fields))
        version += 1
    return {**fields, "version": version}


def _upcast(data: bytes | memoryview) -> AnyEvent:
    try:
        event: AnyEvent = msgspec.convert(upcast(_fields_decoder.decode(data)), AnyEvent)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _failure(data, e) from None
    return event


def _failure(data: bytes | memoryview, error: Exception) -> Exception:
    try:
        envelope = _envelope_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return NotAnEvent(str(error))
    if envelope.type not in KNOWN_TYPES:
        return NotAnEvent(f"unknown event type {envelope.type!r}")
    return Undecodable(f"{envelope.type} version {envelope.version} cannot be read: {error}")
