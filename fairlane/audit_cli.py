"""`fairlane log export` and `fairlane audit`: a cluster's log as a file, and the proof that
every decision on it is what the policy gives (see policy/audit.py).

Both read the log of a running cluster (found like the other cluster commands: --nats, else the
cluster recorded in --data-dir); `audit --file` reads an export instead, so a history can be
audited anywhere.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import cyclopts
import msgspec
import nats.errors as nats_errors
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from events import Event
from events.export import ExportError, export_line, read_export
from fairlane.cluster_cli import DataDir, NatsUrl, Output
from fairlane.cluster_file import DEFAULT_DATA_DIR, read_cluster
from policy.audit import AuditReport, Finding, Scope, as_document, audit, differences
from services.runtime.auth import ADMIN, Credentials, load_credentials
from services.runtime.connection import NotAuthorized, connect
from services.runtime.eventlog import JetStreamLog
from services.runtime.main import configure_logging

err = Console(stderr=True, highlight=False, soft_wrap=True)
Log = list[tuple[int, Event]]
CONNECT_WITHIN_S = 10.0
#: events between two updates of the progress bar (rich redraws it at most 10 times a second)
PROGRESS_EVERY = 500


log_app = cyclopts.App(name="log", help="The cluster's event log.")


@log_app.command(name="export")
def export(
    *,
    out: Annotated[Path | None, cyclopts.Parameter(name=["--out", "-O"])] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
) -> None:
    """Write every stored event with its sequence as JSON lines (to --out, else stdout).

    Parameters
    ----------
    out
        The file to write (default: standard output).
    """
    log = read_log(None, data_dir, nats)
    lines = b"".join(export_line(seq, event) for seq, event in log)
    if out is None:
        sys.stdout.buffer.write(lines)
    else:
        out.write_bytes(lines)
        err.print(f"{len(log):,} events written to {out}")


def audit_command(
    *,
    from_: Annotated[int, cyclopts.Parameter(name="--from")] = 1,
    to: int | None = None,
    job: str | None = None,
    file: Path | None = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Re-derive every decision on the log from the state it was decided on, and check it is
    what the policy gives. Exits 1 if any decision differs, 2 on bad input.

    Parameters
    ----------
    from_
        Check decisions at this log position or later (the whole log is folded regardless).
    to
        Check decisions up to this log position.
    job
        Check only decisions about this job (placed, nominated, stopped, or made room for).
    file
        Audit an export (`fairlane log export`) instead of a running cluster's log.
    """
    if from_ < 1 or (to is not None and to < from_):
        err.print(f"[red]error:[/] --from {from_} --to {to}: not a range of log positions")
        sys.exit(2)
    log = read_log(file, data_dir, nats)
    if log and log[0][0] != 1:
        err.print(
            f"[yellow]warning:[/] the log starts at sequence {log[0][0]}, not 1: states are"
            " folded from there, so decisions may not match what was decided on the whole log"
        )
    with _bar("folding", len(log)) as advance:
        report = audit(log, Scope(from_, to, job), progress=advance, every=PROGRESS_EVERY)
    if output == "json":
        sys.stdout.write(json.dumps(as_document(report), indent=1) + "\n")
    else:
        print_report(Console(highlight=False, soft_wrap=True), report)
    if not report.clean:
        sys.exit(1)


# -- reading the log ------------------------------------------------------------------------------


def read_log(file: Path | None, data_dir: Path, nats: str | None) -> Log:
    """The export in `file`, else the log of the cluster at `nats` or in `data_dir`."""
    if file is not None:
        return _read_file(file)
    url, credentials = _cluster(data_dir, nats)
    return _read_cluster_log(url, credentials)


def _cluster(data_dir: Path, nats: str | None) -> tuple[str, Credentials | None]:
    """Where the log is and whom to read it as. A cluster found in `data_dir` is read as its
    admin user (reading the whole stream is an operator's act); with `--nats`, as the user
    whose credentials file FAIRLANE_NATS_CREDENTIALS names, if any."""
    if nats is not None:
        return nats, None
    running = read_cluster(data_dir.resolve())
    if running is None:
        err.print(f"[red]error:[/] no cluster runs from {data_dir} (start one: fairlane up)")
        sys.exit(2)
    if not running.credentials_dir:  # a server not started here: no users of ours
        return running.nats_url, None
    path = Path(running.credentials_dir) / f"{ADMIN}.json"
    try:
        return running.nats_url, load_credentials(path)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        err.print(f"[red]error:[/] the cluster's admin credentials {path}: cannot read them ({e})")
        sys.exit(2)


def _read_cluster_log(url: str, credentials: Credentials | None) -> Log:
    configure_logging("error")

    async def read() -> Log:
        # bounded: a server that does not answer is not waited for past CONNECT_WITHIN_S
        nc = await asyncio.wait_for(
            connect(url, "fairlane-log-reader", retry_for=5, credentials=credentials),
            CONNECT_WITHIN_S,
        )
        try:
            stream = JetStreamLog(nc)
            log: Log = []
            with _bar("reading the log", await stream.last_seq()) as advance:
                async for stored in stream.read(1):
                    log.append((stored.seq, stored.event))
                    if len(log) % PROGRESS_EVERY == 0:
                        advance(len(log))
                advance(len(log))
            return log
        finally:
            await nc.close()

    try:
        return asyncio.run(read())
    except TimeoutError:
        err.print(
            f"[red]error:[/] cannot read the log at {url}: no connection within"
            f" {CONNECT_WITHIN_S:g} s (is the server up, and does it let this user in?)"
        )
    except (OSError, nats_errors.Error, NotAuthorized) as e:
        err.print(f"[red]error:[/] cannot read the log at {url}: {e or type(e).__name__}")
    sys.exit(2)


def _read_file(path: Path) -> Log:
    try:
        with path.open("rb") as lines:
            return list(read_export(lines))
    except OSError as e:
        err.print(f"[red]error:[/] --file {path}: cannot read it ({e.strerror})")
    except ExportError as e:
        err.print(f"[red]error:[/] --file {path}: {e}")
    sys.exit(2)


@contextmanager
def _bar(what: str, total: int) -> Iterator[Callable[[int], None]]:
    bar = Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    task = bar.add_task(what, total=total)
    with bar:
        yield lambda done: bar.update(task, completed=done)


# -- the report -----------------------------------------------------------------------------------


def print_report(console: Console, report: AuditReport) -> None:
    doc = as_document(report)
    head = Table(title="fairlane audit", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column(justify="right")
    head.add_row("policy version", report.policy_version)
    head.add_row("events folded", f"{report.events:,}")
    head.add_row("decisions checked", f"{report.checked:,}")
    head.add_row("matched", f"{report.matched:,}")
    head.add_row("mismatched", f"{len(report.mismatches):,}")
    head.add_row("made by another policy version or actor", f"{report.not_compared:,}")
    for reason, count in doc["refused"].items():
        head.add_row(f"refused by the fold: {reason}", f"{count:,}")
    if report.usage_checked:
        # rule 11: the decayed usage U (and P) those decisions weighed, re-derived from the log
        head.add_row("weighed usage history (U, P)", f"{report.usage_checked:,}")
        head.add_row("U and P re-derived exactly", f"{report.usage_matched:,}")
    console.print(head)
    for finding in report.findings:
        if finding.outcome != "matches":
            _print_finding(console, finding)
    if report.clean:
        console.print("[green]every decision checked is what the policy gives[/]")


_SAYS = {
    "differs": "[red]differs from what the policy gives[/]",
    "not_derived": "[red]the policy makes no such decision[/]",
    "other_version": "[yellow]made by another policy version: not compared[/]",
    "other_actor": "[yellow]made by an actor other than the policy: not compared[/]",
}


def _print_finding(console: Console, f: Finding) -> None:
    d = f.decision
    console.print(
        f"\n[bold]#{f.seq}[/] {type(d).__name__} {d.id} (by {d.actor}, policy"
        f" {f.policy_version}, decided on #{d.basis_seq}): {_SAYS[f.outcome]}"
    )
    verdict = "applied" if f.verdict.applied else f"refused: {f.verdict.reason}"
    console.print(f"  the fold: {verdict}")
    if f.derived is not None:
        for name, (recorded, policy) in differences(d, f.derived).items():
            console.print(f"  {name}: recorded {_show(recorded)}, the policy gives {_show(policy)}")
    if f.outcome == "not_derived":
        if not f.instead:
            console.print("  the policy gives nothing else in its place")
        for e in f.instead:
            console.print(f"  the policy gives instead: {type(e).__name__} {_show(e)}")


def _show(value: object) -> str:
    return msgspec.json.encode(value).decode()
