"""How commands answer: rich tables for people, `-o json` and `-o yaml` for scripts, and one
exit-status convention.

Exit status: 0 done; 1 the operation failed, was refused, or what it names does not exist;
2 bad usage or a bad value (the message names it).
"""

from __future__ import annotations

import datetime
import io
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Final, Literal, NoReturn

import cyclopts
from rich.console import Console
from rich.markup import escape

from fairlane.client import ApiError, CliError

OK: Final = 0
FAILED: Final = 1
USAGE: Final = 2
EXIT_STATUS_HELP: Final = (
    "Exit status: 0 done; 1 the operation failed, was refused or names something that does "
    "not exist; 2 bad usage or a bad value."
)

Format = Literal["table", "json", "yaml"]
Output = Annotated[
    Format,
    cyclopts.Parameter(name=["--output", "-o"], help="table for people; json or yaml for scripts"),
]

#: Piped output is not cut to 80 columns (a terminal's own width, or COLUMNS, wins).
_WIDTH: Final = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
console = Console(highlight=False, soft_wrap=True, width=_WIDTH, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def fail(message: str, code: int = FAILED) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}")
    sys.exit(code)


@contextmanager
def errors_said() -> Iterator[None]:
    """Turn a CliError into its message and exit status; never a traceback."""
    try:
        yield
    except CliError as e:
        fail(str(e), e.code)


@contextmanager
def flags_named(sent: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """An API error about a value the command sent says which flag gave it, and the value:
    `--gpus -1: ...` rather than the API's `Expected int >= 0 (in body)`. `sent` holds what was
    sent, by the API's field name; `flags`, the flag of a field not spelt `--field-name`."""
    try:
        yield
    except ApiError as e:
        # `command[0]`, `env[...]`: an item of a field (the item itself where it is numbered)
        field, _, index = (e.field or "").partition("[")
        if field not in sent:
            raise
        flag = (flags or {}).get(field) or "--" + field.replace("_", "-")
        value = sent[field]
        if index.rstrip("]").isdigit() and isinstance(value, list | tuple):
            value = value[int(index.rstrip("]"))] if int(index.rstrip("]")) < len(value) else ""
        elif index:  # an item not named (a key of `env`): the flag alone
            value = ""
        shown = " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
        # cut short, as the API cuts what it repeats: a 100 kB value once is enough
        shown = shown if len(shown) <= SHOWN_MAX else shown[:SHOWN_MAX] + "…"
        said = f"{flag} {shown}" if shown else flag
        raise ApiError(e.status, f"{said}: {e}", e.field) from None


#: The longest value an error repeats.
SHOWN_MAX: Final = 60


# The converters' errors are shown by cyclopts as `Invalid value for --FLAG: <message>`, with
# exit status 2: the message names the value.


def _whole(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def whole_number(_: Any, tokens: Sequence[Any]) -> int:
    """A whole number. (cyclopts on its own rounds `1.9` to 2 and `0.5` to 0, silently.)"""
    return _whole(tokens[0].value)


def whole_gpus(_: Any, tokens: Sequence[Any]) -> int:
    """A whole number of GPUs, 0 or more: runai's `--gpus 0.5` is refused, not rounded."""
    text = tokens[0].value
    try:
        fraction = float(text)
    except ValueError:
        fraction = None
    if fraction is not None and not fraction.is_integer():
        raise ValueError(
            f"{text!r}: fractional GPUs are not supported yet; give a whole number of GPUs "
            "(0 runs on CPU only)"
        )
    gpus = _whole(text)
    if gpus < 0:
        raise ValueError(f"{text!r}: a job takes 0 GPUs or more")
    return gpus


#: Integer flags: a fraction is refused with the flag and the value, never rounded.
Whole = Annotated[int, cyclopts.Parameter(converter=whole_number)]
#: The flags of rule 11's settings (`policy.decay.settings_problem` names the one at fault).
USAGE_FLAGS: Final = {"usage_half_life_s": "--usage-half-life", "usage_k": "--usage-k"}
MaybeWhole = Annotated[int | None, cyclopts.Parameter(converter=whole_number)]
Gpus = Annotated[int, cyclopts.Parameter(converter=whole_gpus)]
MaybeGpus = Annotated[int | None, cyclopts.Parameter(converter=whole_gpus)]


_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: object, flag: str) -> float:
    """Seconds from a length of time as a person gives it (`events.units`' grammar: 45, 90s,
    10m, 1h30m, 30d); a usage error naming `flag` otherwise."""
    try:
        return _seconds(text)
    except ValueError as e:
        raise CliError(f"{flag} takes a length of time: {e}", USAGE) from None


def length_of_time(_: Any, tokens: Sequence[Any]) -> float:
    """A flag's length of time: seconds, or 90s, 10m, 1h30m, 1d (cyclopts names the flag)."""
    return _seconds(tokens[0].value)


def _seconds(value: object) -> float:
    # imported here: the event catalogue `events` loads is for the commands that need it,
    # not for every command's start
    from events.units import parse_duration as seconds_of  # noqa: PLC0415

    return seconds_of(value)


#: A length of time given to a flag (None: not given)
MaybeSeconds = Annotated[
    float | None, cyclopts.Parameter(converter=length_of_time, metavar="DURATION")
]


def parse_when(text: str, flag: str, now: float | None = None) -> float:
    """A point in time as a person gives it: `10m`, `2h`, `1d` (that long ago), a date and time
    (`2026-11-25T14:00`, local time unless it names its zone), or Unix seconds."""
    value = text.strip()
    if value[-1:] in _UNITS and value[:-1].replace(".", "", 1).isdigit():
        return (now or time.time()) - float(value[:-1]) * _UNITS[value[-1]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise CliError(
            f"{flag} takes a time: 10m, 2h or 1d ago, a date and time such as "
            f"2026-11-25T14:00, or Unix seconds; got {text!r}",
            USAGE,
        ) from None


def emit(data: Any, output: Format, table: Callable[[Any], None]) -> None:
    """`data` as JSON or YAML, or drawn by `table` for people."""
    if output == "json":
        import msgspec  # noqa: PLC0415  (only -o json needs it: a table starts faster)

        sys.stdout.write(msgspec.json.encode(data).decode() + "\n")
    elif output == "yaml":
        sys.stdout.write(to_yaml(data))
    else:
        table(data)


def to_yaml(data: Any) -> str:
    import msgspec  # noqa: PLC0415
    from ruamel.yaml import YAML  # noqa: PLC0415  (slow to import; only -o yaml needs it)

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.representer.sort_base_mapping_type_on_output = False  # keep the API's order
    buffer = io.StringIO()
    yaml.dump(msgspec.to_builtins(data), buffer)
    return buffer.getvalue()


def ago(then: float | None, now: float | None = None) -> str:
    """'3m ago'-style age of a time, or '-'."""
    if then is None:
        return "-"
    return duration((now or time.time()) - then) + " ago"


def size(count: int) -> str:
    """A number of bytes as a person reads it: 512 bytes, 10.2 kB, 3.4 MB, 1.2 GB (powers of
    1,000, as disks and object stores count)."""
    if count < 1000:
        return f"{count} bytes"
    value, unit = count / 1000, "kB"
    for larger in ("MB", "GB"):
        if value < 999.95:  # (what rounds to 1000.0 reads better as the next unit's 1.0)
            break
        value, unit = value / 1000, larger
    return f"{value:.1f} {unit}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


STATE_STYLES: Final = {
    "running": "green",
    "starting": "green",
    "pending": "yellow",
    "submitted": "yellow",
    "stopping": "magenta",
    "paused": "blue",
    "completed": "dim",
    "cancelled": "dim",
    "failed": "red",
    "rejected": "red",
}


def state(name: str) -> str:
    style = STATE_STYLES.get(name)
    return f"[{style}]{name}[/]" if style else name


def said(answer: dict[str, Any], what: str) -> None:
    """A command's answer in words: the event it led to."""
    event = answer.get("event", {})
    kind = answer.get("type", "")
    words = {
        "JobAdmitted": "admitted",
        "JobSubmitted": "submitted",
        "JobCancelled": "deleted",
        "JobPaused": "paused",
        "JobResumed": "resumed",
        "JobPriorityChanged": "changed",
        "ProjectConfigured": "configured",
        "PoolConfigured": "configured",
    }.get(kind, kind)
    detail = ""
    if kind == "JobAdmitted":
        detail = f" (priority {event.get('priority')}, pool {', '.join(event.get('pools', []))})"
    elif kind == "JobPriorityChanged":
        detail = f": priority {event.get('priority')}"
    console.print(f"{escape(what)} {words}{escape(detail)} [dim]({kind})[/]")
