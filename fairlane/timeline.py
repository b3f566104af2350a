"""Timeline entries (from the API) told in words: what happened, where, and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
from rich.markup import escape
from rich.table import Table

from events.catalogue import AnyEvent
from fairlane.output import clock, console
from policy.decay import in_words

#: Fields every event has, or that a timeline entry already shows in its own columns.
_COMMON: Final = {
    "type", "v", "version", "id", "time", "actor", "job_id", "causation", "project", "pool",
}  # fmt: skip


def details(entry: dict[str, Any]) -> str:
    """One event's particulars in a line or two (plain text)."""
    event = entry.get("event", {})
    tell = _TELLERS.get(entry["type"])
    if tell is not None:
        text = tell(entry, _whole(entry["type"], event))
    else:
        rest = {k: v for k, v in event.items() if k not in _COMMON and v not in (None, "", [], {})}
        text = _pairs(rest)
    if not entry.get("applied", True):
        text += " [not applied: the log had moved on]"
    return text


def _whole(kind: str, event: dict[str, Any]) -> dict[str, Any]:
    """The event with the fields the log leaves out (those at their default) filled in; as it
    came where it does not decode as this version's event."""
    try:
        struct = msgspec.convert({**event, "type": kind}, AnyEvent)
    except msgspec.ValidationError:
        return event
    left_out = (name for name in struct.__struct_fields__ if name not in event)
    return {**event, **{name: msgspec.to_builtins(getattr(struct, name)) for name in left_out}}


def _scheduled(entry: dict[str, Any], event: dict[str, Any]) -> str:
    where = ", ".join(f"{r[0]}:{','.join(map(str, r[1]))}" for r in event.get("replicas", []))
    text = f"attempt {event.get('attempt')} on {where}"
    return text + (f" ({event['note']})" if event.get("note") else "") + _history(event)


def _preemption_requested(entry: dict[str, Any], event: dict[str, Any]) -> str:
    text = f"reason {entry.get('reason')}"
    if entry.get("for_job"):
        text += f", to make room for {entry['for_job']}"
    facts = event.get("facts") or {}
    if facts.get("fair_share"):
        text += f"; fair shares {_pairs(facts['fair_share'])}"
    if facts.get("usage"):
        text += f", usage {_pairs(facts['usage'])}"
    return text + _history(facts)


def _preempted(entry: dict[str, Any], event: dict[str, Any]) -> str:
    text = f"stopped ({event.get('reason')})"
    text += ", checkpoint saved" if event.get("checkpointed") else ""
    if event.get("stored_bytes"):  # in the cluster's checkpoint store, for any node
        text += f" and stored ({event['stored_bytes']} bytes)"
    text += ", killed after its grace" if event.get("killed") else ""
    return text + _utilization(event)


def _utilization(event: dict[str, Any]) -> str:
    """The attempt's mean GPU utilization, as its executor sampled it (where it could)."""
    value = event.get("gpu_utilization")
    return f"; GPU utilization {value:.0f}% on average" if value is not None else ""


def _submitted(entry: dict[str, Any], event: dict[str, Any]) -> str:
    spec = event.get("spec", {})
    text = f"{spec.get('gpus', 1)} GPU(s) x {spec.get('replicas', 1)}"
    if spec.get("priority_class"):
        text += f", class {spec['priority_class']}"
    if spec.get("priority") is not None:
        text += f", priority {spec['priority']}"
    return text + (f", by {entry['actor']}" if entry.get("actor") else "")


def _nominated(entry: dict[str, Any], event: dict[str, Any]) -> str:
    victims = event.get("victims") or []
    if victims:
        return f"GPUs held for it while {', '.join(victims)} stop" + _history(event)
    return "GPUs held for it while they are given back" + _history(event)


def _history(holder: dict[str, Any]) -> str:
    """Rule 11: how the usage history moved the fair shares the decision weighed, in words."""
    history = holder.get("history")
    return f"; {in_words(history)}" if history else ""


def _admitted(entry: dict[str, Any], event: dict[str, Any]) -> str:
    text = f"priority {event.get('priority')}, {event.get('gpus')} GPU(s) x "
    return text + f"{event.get('replicas')}, pools {', '.join(event.get('pools', []))}"


_TELLERS: Final[dict[str, Callable[[dict[str, Any], dict[str, Any]], str]]] = {
    "JobScheduled": _scheduled,
    "JobPreemptionRequested": _preemption_requested,
    "JobPreempted": _preempted,
    "JobSubmitted": _submitted,
    "JobAdmitted": _admitted,
    "JobNominated": _nominated,
    "JobStarted": lambda _, e: "resumed" if e.get("resumed") else "started",
    "JobFailed": lambda _, e: (
        f"exit code {e.get('exit_code')}: {e.get('reason', '')}" + _utilization(e)
    ),
    "JobCompleted": lambda _, e: f"attempt {e.get('attempt')}" + _utilization(e),
    "JobRejected": lambda _, e: str(e.get("reason", "")),
}


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def print_timeline(
    entries: list[dict[str, Any]], title: str | None = None, job: bool = True
) -> None:
    if not entries:
        console.print("no events")
        return
    table = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    table.add_column("TIME")
    table.add_column("SEQ", justify="right")
    table.add_column("EVENT")
    if job:
        table.add_column("JOB")
    table.add_column("DETAILS", overflow="fold")
    for entry in entries:
        row = [clock(entry["time"]), str(entry["seq"]), entry["type"]]
        if job:
            row.append(escape(entry.get("job_id") or entry.get("project") or "-"))
        style = "" if entry.get("applied", True) else "dim"
        row.append(escape(details(entry)))
        table.add_row(*row, style=style)
    console.print(table)
