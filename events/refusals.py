"""Why a command is refused, as a code, and the words each code is said in.

A refusal travels as its code, the request field it is about and its words (a command's
`Reply`, a `JobRejected`): a reader chooses what to do by the code (the API its HTTP status),
never by parsing the words. The words come from `WORDS`, one template a code, filled with the
values that make the refusal (the value refused always among them).
"""

from __future__ import annotations

from typing import Final, Literal

RefusalCode = Literal[
    "invalid_name",  # a name that breaks the pattern names follow
    "out_of_range",  # a number outside its bounds
    "bad_port",  # a port out of range, or a host port given twice
    "unknown_project",
    "unknown_pool",
    "unknown_node",
    "unknown_class",
    "not_found",  # no job has this id
    "name_taken",  # a job has this id already
    "never_fits",  # no pool the job names could hold it, even empty
    "over_limit",  # the job is larger than its project's limit
    "not_in_pool",  # the job's node is in none of its pools
    "no_pool",  # the cluster has no pool yet
    "wrong_phase",  # the job is not in a phase the command applies to
    "no_change",  # the job is so already
    "not_taken_here",  # the command went to a service that does not take it
    "ended",  # the job was ended before its verdict
    "bad_volume",  # a volume or host prefix that is malformed or not allowed
    "not_allowed",  # a host prefix the volume allowlist does not hold
]

#: The words of each refusal; `value` is the value refused.
WORDS: Final[dict[RefusalCode, str]] = {
    "invalid_name": "{what} {value!r} is not valid: {rule}",
    "out_of_range": "{what} must {bound}, got {value}",
    "bad_port": "port {value}: {problem}",
    "unknown_project": "unknown project {value!r} (known: {known})",
    "unknown_pool": "unknown pool {value!r} (known: {known})",
    "unknown_node": "unknown node {value!r} (known: {known})",
    "unknown_class": "unknown priority class {value!r} (known: {known})",
    "not_found": "unknown job id {value!r}",
    "name_taken": "job id {value!r} already exists",
    "never_fits": "the job can never fit: {value}",
    "over_limit": (
        "job needs {value} GPUs, more than project {project!r}'s limit of {limit} in pool {pool!r}"
    ),
    "not_in_pool": "node {value!r} is not in pool {pools}",
    "no_pool": "the cluster has no pool yet",
    "wrong_phase": "job {value!r} cannot be {done}: it is {phase}",
    "no_change": "job {value!r} has priority {priority} already",
    "not_taken_here": "{service} does not take {value} commands",
    "ended": "job {value!r} was ended before admission could answer",
    "bad_volume": "{problem}",
    "not_allowed": "host prefix {value!r} is not allowed now (allowed: {allowed})",
}


def say(code: RefusalCode, value: object = None, **values: object) -> str:
    """The words of a refusal with this code, naming `value` (unused by a code about none)."""
    return WORDS[code].format(value=value, **values)
