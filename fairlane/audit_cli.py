"""`fairlane log export` and `fairlane audit`: a cluster's log as a file, and the proof that
every decision on it is what the policy gives (see policy/audit.py).

Both read the log of a running cluster (found like the other cluster commands: --nats, else the
cluster recorded in --data-dir); `audit --file` reads an export instead, so a history can be
audited anywhere.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import cyclopts
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cluster import log_reading
from cluster.cluster_file import DEFAULT_DATA_DIR
from events import Event
from events.export import ExportError, export_line, read_export
from fairlane.cluster_cli import DataDir, NatsUrl, Output
from policy.audit import AuditReport, Finding, Reader, Scope, as_document, audit, differences

err = Console(stderr=True, highlight=False, soft_wrap=True)
Log = list[tuple[int, Event]]
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
    with opened_log(None, data_dir, nats) as (read, _):
        if out is None:
            sys.stdout.buffer.writelines(export_line(seq, event) for seq, event in read(1))
            return
        with out.open("wb") as lines:
            written = 0
            for seq, event in read(1):
                lines.write(export_line(seq, event))
                written += 1
    err.print(f"{written:,} events written to {out}")


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
    with opened_log(file, data_dir, nats) as (read, total), _bar("auditing", total) as advance:
        scope = Scope(from_, to, job)
        report = audit(_from_the_start(read), scope, progress=advance, every=PROGRESS_EVERY)
    if output == "json":
        sys.stdout.write(json.dumps(as_document(report), indent=1) + "\n")
    else:
        print_report(Console(highlight=False, soft_wrap=True), report)
    if not report.clean:
        sys.exit(1)


# -- reading the log ------------------------------------------------------------------------------


def read_log(file: Path | None, data_dir: Path, nats: str | None) -> Log:
    """The whole log in memory (for `whatif`; the audit and the export stream it)."""
    with opened_log(file, data_dir, nats) as (read, _):
        return list(read(1))


@contextmanager
def opened_log(file: Path | None, data_dir: Path, nats: str | None) -> Iterator[tuple[Reader, int]]:
    """The export in `file`, else the log of the cluster at `nats` or in `data_dir`, as a
    `Reader`, with the number of events it holds. A log that cannot be read (while the block
    runs) ends the command with status 2, naming why."""
    if file is not None:
        with _file_errors(file):
            yield _file_reader(file), _count_lines(file)
        return
    try:
        with log_reading.stream(*log_reading.where(data_dir, nats)) as opened:
            yield opened
    except log_reading.LogUnreachable as e:
        err.print(f"[red]error:[/] {e}")
        sys.exit(2)


def _file_reader(path: Path) -> Reader:
    def read(first: int) -> Iterator[tuple[int, Event]]:
        with path.open("rb") as lines:
            for seq, event in read_export(lines):
                if seq >= first:
                    yield seq, event

    return read


def _count_lines(path: Path) -> int:
    with path.open("rb") as data:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: data.read(1 << 20), b""))


@contextmanager
def _file_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        err.print(f"[red]error:[/] --file {path}: cannot read it ({e.strerror})")
        sys.exit(2)
    except ExportError as e:
        err.print(f"[red]error:[/] --file {path}: {e}")
        sys.exit(2)


def _from_the_start(read: Reader) -> Reader:
    """`read`, with a warning (once) if the log does not start at sequence 1."""
    warned = False

    def checked(first: int) -> Iterator[tuple[int, Event]]:
        nonlocal warned
        for seq, event in read(first):
            if not warned and first == 1 and seq != 1:
                err.print(
                    f"[yellow]warning:[/] the log starts at sequence {seq}, not 1: states are"
                    " folded from there, so decisions may not match what was decided on the"
                    " whole log"
                )
            warned = True
            yield seq, event

    return checked


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
