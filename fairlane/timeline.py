"""Timeline entries (from the API) told in words: what happened, where, and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
from rich.markup import escape
from rich.table import Table

from fairlane.client import Api
from fairlane.output import clock, console, size
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
    # the event catalogue is imported only to tell events: `list` and `--help` start faster
    from events.catalogue import AnyEvent  # noqa: PLC0415

    try:
        struct = msgspec.convert({**event, "type": kind}, AnyEvent)
    except msgspec.ValidationError:
        return event
    left_out = (name for name in struct.__struct_fields__ if name not in event)
    return {**event, **{name: msgspec.to_builtins(getattr(struct, name)) for name in left_out}}


def _scheduled(entry: dict[str, Any], event: dict[str, Any]) -> str:
    where = ", ".join(
        f"{node}:{','.join(map(str, gpus))}" if gpus else f"{node} (no GPU)"
        for node, gpus in event.get("replicas", [])
    )
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
    if event.get("own_replicas") and event.get("node"):
        # a stop spanning nodes is reported by each node for its own replicas: one line each
        text += f" on {event['node']}"
    text += ", checkpoint saved" if event.get("checkpointed") else ""
    if event.get("stored_bytes"):  # in the cluster's checkpoint store, for any node
        text += f" and stored ({size(event['stored_bytes'])})"
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


def _node_lost(entry: dict[str, Any], event: dict[str, Any]) -> str:
    text = f"node {event.get('node')} lost" + (
        f" ({event['reason']})" if event.get("reason") else ""
    )
    if entry.get("job_id"):  # on a job's timeline: the attempt placed there ended with it
        attempt = entry.get("ended_attempt")
        which = f"attempt {attempt}" if attempt else "the attempt on it"
        text += f"; {which} ended there and the job queues again"
    return text


def _terms(event: dict[str, Any]) -> str:
    parts = []
    for pool, t in (event.get("terms") or {}).items():
        limit = "none" if t.get("limit") is None else t["limit"]
        parts.append(f"in {pool}: quota {t.get('quota', 0)}, weight "
                     f"{t.get('over_quota_weight', 1)}, limit {limit}, priority "
                     f"{t.get('priority', 100)}")  # fmt: skip
    return "; ".join(parts) or "no terms"


def _scheduler(settings: dict[str, Any] | None) -> str:
    if not settings:
        return "follows the cluster's scheduler settings"
    kind, fitting = settings.get("type", "fair_share"), settings.get("fitting", "best")
    return f"scheduler {kind}, fitting {fitting}, victims {settings.get('victim_order', 'newest')}"


def _cluster(entry: dict[str, Any], event: dict[str, Any]) -> str:
    settings = event.get("settings") or {}
    classes = ", ".join(
        f"{c['name']} {c['priority']}" for c in settings.get("priority_classes", [])
    )
    text = f"{_scheduler(settings.get('scheduler'))}; grace {settings.get('preemption_grace_s')} s"
    return text + (f"; classes {classes}" if classes else "")


def _progress(entry: dict[str, Any], event: dict[str, Any]) -> str:
    parts = [f"{k} {event[k]}" for k in ("step", "epoch") if event.get(k) is not None]
    parts += [f"{k} {v:g}" for k, v in (event.get("metrics") or {}).items()]
    text = ", ".join(parts) or "alive"
    folded = entry.get("folded", 0)
    return text + (f" (latest of {folded + 1} progress reports)" if folded else "")


def _checkpointed(entry: dict[str, Any], event: dict[str, Any]) -> str:
    text = f"checkpoint of attempt {event.get('attempt')} saved"
    if event.get("step") is not None:
        text += f" at step {event['step']}"
    if event.get("size_bytes") is not None:
        text += f", {size(event['size_bytes'])}"
    if event.get("refused"):
        text += ", not stored (over the checkpoint store's bound)"
    save_s = event.get("save_s") or 0
    return text + (f" in {save_s:.1f} s" if save_s else "")


def _quota_crossed(entry: dict[str, Any], event: dict[str, Any]) -> str:
    where = "over its quota" if event.get("over") else "back within its quota"
    return (f"project {event.get('project')} {where} in {event.get('pool')}: "
            f"{event.get('usage')} GPU(s) in use, quota {event.get('quota')}")  # fmt: skip


def _by(entry: dict[str, Any]) -> str:
    return f" by {entry['actor']}" if entry.get("actor") else ""


_TELLERS: Final[dict[str, Callable[[dict[str, Any], dict[str, Any]], str]]] = {
    "ClusterConfigured": _cluster,
    "SchedulingHeld": lambda _, e: (
        f"scheduling held ({e.get('reason') or 'no reason given'})"
        if e.get("held") else "scheduling goes on"
    ),
    "PoolConfigured": lambda _, e: f"pool {e.get('pool')}: {_scheduler(e.get('scheduler'))}",
    "VolumesConfigured": lambda entry, e: (
        "host folders jobs may mount: "
        + (", ".join(
            f"{g.get('prefix')} ({'read-write' if g.get('read_write') else 'read-only'})"
            for g in e.get("grants") or ()
        ) or "none") + _by(entry)
    ),
    "NodeRegistered": lambda _, e: (
        f"node {e.get('node')} joined pool {e.get('pool')} with {e.get('gpus')} GPU(s)"
        + (f" ({e['gpu_source']})" if e.get("gpu_source") else "")
    ),
    "NodeLost": _node_lost,
    "NodeCordoned": lambda entry, e: (
        f"node {e.get('node')} "
        + ("drained: its jobs move elsewhere" if e.get("drain") else "cordoned: no new work")
        + _by(entry) + (f" ({e['reason']})" if e.get("reason") else "")
    ),
    "NodeUncordoned": lambda entry, e: (
        f"node {e.get('node')} back in service" + _by(entry)
        + (f" ({e['reason']})" if e.get("reason") else "")
    ),
    "EventSetAside": lambda _, e: (
        f"{e.get('service')} set aside event {e.get('seq')} on {e.get('subject')}: "
        f"{e.get('reason')}"
    ),
    "ProjectConfigured": lambda _, e: f"project {e.get('project')}: {_terms(e)}",
    "ProjectQuotaCrossed": _quota_crossed,
    "LeaderElected": lambda _, e: (
        f"{e.get('holder')} leads the {e.get('kind')} (term {e.get('term')})"
    ),
    "JobScheduled": _scheduled,
    "JobPreemptionRequested": _preemption_requested,
    "JobPreempted": _preempted,
    "JobSubmitted": _submitted,
    "JobAdmitted": _admitted,
    "JobNominated": _nominated,
    "JobStarted": lambda _, e: (
        f"attempt {e.get('attempt')} " + ("resumed" if e.get("resumed") else "started")
    ),
    "JobCheckpointed": _checkpointed,
    "JobProgress": _progress,
    "JobMessage": lambda _, e: f"attempt {e.get('attempt')} says: {e.get('text', '')}",
    "JobPaused": lambda entry, _: "paused" + _by(entry),
    "JobResumed": lambda entry, _: "resumed" + _by(entry),
    "JobCompleted": lambda _, e: f"attempt {e.get('attempt')} completed" + _utilization(e),
    "JobFailed": lambda _, e: (
        f"exit code {e.get('exit_code')}: {e.get('reason') or 'failed'} "
        f"(attempt {e.get('attempt')})" + _utilization(e)
    ),
    "JobCancelled": lambda entry, _: "deleted" + _by(entry),
    "JobPriorityChanged": lambda entry, e: f"priority set to {e.get('priority')}" + _by(entry),
    "JobRejected": lambda _, e: f"rejected: {e.get('reason', '')}",
    "WorkRelayed": lambda _, e: (
        f"{e.get('event', {}).get('type', 'an event')} relayed to node {e.get('node')}'s "
        "executor"
    ),
}  # fmt: skip


def _pairs(values: dict[str, Any]) -> str:
    """`key value, ...`; nested values the same way, never as a Python dict or list."""
    return ", ".join(f"{k} {_plain(v)}" for k, v in values.items())


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return "(" + _pairs(value) + ")"
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    return str(value)


def fold_progress(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run of progress reports (`JobProgress`, one every few seconds while a job runs)
    as its latest, with `folded` saying how many before it were left out; and each node loss
    on a job's timeline with the attempt it ended (`ended_attempt`)."""
    folded: list[dict[str, Any]] = []
    attempt = None
    for given in entries:
        entry = given
        if entry["type"] == "JobScheduled":
            attempt = entry.get("event", {}).get("attempt")
        elif entry["type"] == "NodeLost" and entry.get("job_id") and attempt is not None:
            entry = {**entry, "ended_attempt": attempt}
        if folded and entry["type"] == "JobProgress" and folded[-1]["type"] == "JobProgress":
            folded[-1] = {**entry, "folded": folded[-1].get("folded", 0) + 1}
        else:
            folded.append(entry)
    return folded


def left_out(shown: int, since: str | None) -> str:
    """The line saying which events a listing left out, and how to see them."""
    if since is None:
        return (
            f"the newest {shown} events are shown; earlier ones were left out "
            "(--limit N for more, --since TIME to start from a time)"
        )
    return (
        f"the first {shown} events from {since} on are shown; later ones were left out (--limit N)"
    )


def past_events(
    api: Api, path: str, limit: int, types: list[str] | None = None, since: float | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The newest `limit` events that match (or with `since`, the first from then on), in log
    order, and whether there were more; in pages of 500."""
    pages: list[list[dict[str, Any]]] = []
    got, cursor, newest = 0, None, since is None
    while got < limit:
        where = {"before": cursor} if newest else {"after": cursor}
        page = api.get(path, limit=min(500, limit - got), type=types, since=since,
                       newest=newest or None, **where)  # fmt: skip
        pages.append(page["items"])
        got += len(page["items"])
        cursor = page["next"]
        if cursor is None:
            break
    if newest:
        pages.reverse()
    return [e for page in pages for e in page], cursor is not None


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
