"""A job spec in a file (`fairlane submit -f job.yaml`): the fields of `submit`'s flags, spelt as
the flags are (`min-replicas`, or `min_replicas`), and `name` for the job's name.

```yaml
name: train-1
project: team-a
class: train
gpus: 2
command: [python3, train.py, --lr, "0.1"]
env: {WANDB_MODE: offline}
```

Its own module: `submit` without a file, and every other command, need neither msgspec nor the
YAML parser.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from fairlane.client import CliError
from fairlane.output import USAGE, parse_duration


class JobFile(msgspec.Struct, forbid_unknown_fields=True, rename="kebab"):
    name: str | None = None
    project: str | None = None
    job_class: str | None = msgspec.field(default=None, name="class")
    priority: int | None = None
    gpus: int | None = None
    replicas: int | None = None
    min_replicas: int | None = None
    pool: list[str] | str | None = None
    node: str | None = None
    image: str | None = None
    command: list[str] | str | None = None
    env: dict[str, str] | list[str] | None = None
    preemptible: bool | None = None
    #: lengths of time: seconds, or 90s, 10m, 1h30m (read with `parse_duration`)
    preemption_delay: float | str | None = None
    min_runtime: float | str | None = None
    grace: float | str | None = None
    working_dir: str | None = None
    #: HOST:CONTAINER[:ro|rw], as `--volume` takes them
    volume: list[str] | str | None = None
    idempotency_key: str | None = None


FIELDS = tuple(
    f.encode_name
    for f in msgspec.structs.fields(JobFile)  # the keys a file may hold
)


def read_job_file(path: Path) -> JobFile:
    """The job spec in `path`, or a usage error naming the file and the key at fault."""
    try:
        loaded = YAML(typ="safe").load(path.read_text())
    except OSError as e:
        raise CliError(f"-f {path}: cannot read it: {e.strerror}", USAGE) from None
    except YAMLError as e:
        raise CliError(f"-f {path}: not valid YAML: {e}", USAGE) from None
    if not isinstance(loaded, dict):
        raise CliError(f"-f {path}: a job spec is a mapping of fields ({', '.join(FIELDS)})",
                       USAGE)  # fmt: skip
    fields = {str(k).replace("_", "-"): v for k, v in loaded.items()}
    for key, value in fields.items():
        if key not in FIELDS:
            near = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else f" (it may hold {', '.join(FIELDS)})"
            raise CliError(f"-f {path}: unknown field {key!r}{hint}", USAGE)
        if key == "gpus" and isinstance(value, float) and not value.is_integer():
            raise CliError(f"-f {path}: gpus {value}: fractional GPUs are not supported yet",
                           USAGE)  # fmt: skip
    try:
        spec = msgspec.convert(fields, JobFile)
    except msgspec.ValidationError as e:
        raise CliError(f"-f {path}: {_said(e)}", USAGE) from None
    seconds = {
        key.replace("-", "_"): parse_duration(value, f"-f {path}: {key}")
        for key, value in fields.items()
        if key in _LENGTHS_OF_TIME and value is not None
    }
    return msgspec.structs.replace(spec, **seconds)


_LENGTHS_OF_TIME = frozenset({"preemption-delay", "min-runtime", "grace"})


def job_fields(path: Path) -> dict[str, Any]:
    """The fields the file in `path` gives, by their names in the file (`min-replicas`)."""
    given = msgspec.to_builtins(read_job_file(path))
    return {k: v for k, v in given.items() if v is not None}


def _said(error: msgspec.ValidationError) -> str:
    """msgspec's `Expected int, got str - at $.gpus` as `gpus: expected int, got str`."""
    text = str(error)
    message, _, where = text.partition(" - at `$.")
    field = where.split("`")[0].split(".")[0].split("[")[0]
    return f"{field}: {message[0].lower()}{message[1:]}" if field else text
