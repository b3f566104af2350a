"""The small supervisor between the executor and a workload process.

`python -m services.executor.shim --exit-file F [--cwd D] [--uid U --gid G] -- COMMAND...`

The executor starts this in a session (and process group) of its own; the shim starts the
workload in that same group, waits for it and writes its exit status to `F` before exiting with
the same status. That file is what lets an executor that was restarted (or crashed) learn how a
workload it did not start itself ended: the workload is not its child, so it cannot wait for it.

Signals go to the whole group (the executor uses `killpg`), so the workload and anything it
started get SIGTERM directly. The shim itself only notes SIGTERM/SIGINT and keeps waiting, so
the exit status is still recorded; a SIGKILL of the group ends the shim too (the executor that
sent it knows why the workload ended).

With `--uid`/`--gid` (the executor runs as root: `services.executor.identity`) the shim stays
root, so it can still write the exit file among the executor's private files, and the workload
alone runs as that uid and gid with no supplementary groups; it enters its working directory
as that user, so a folder it may not enter is refused rather than entered by root for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

COMMAND_NOT_FOUND = 127
CANNOT_EXECUTE = 126


def exit_code_of(returncode: int) -> int:
    """A shell's convention: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def write_exit_file(path: Path, code: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, path)


def _keep_waiting(signum: int, frame: FrameType | None) -> None:
    """The workload got the same signal (it is sent to the group); the shim outlives it."""


def _start(
    command: list[str], cwd: Path | None, uid: int | None, gid: int | None
) -> subprocess.Popen[bytes]:
    if uid is None:
        return subprocess.Popen(command, cwd=cwd)

    def enter() -> None:  # after the switch: the kernel checks the workload's own rights
        if cwd is not None:
            os.chdir(cwd)

    return subprocess.Popen(
        command,
        user=uid,
        group=gid if gid is not None else uid,
        extra_groups=[],
        umask=0o077,
        preexec_fn=enter,  # noqa: PLW1509  (the shim has no threads)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.executor.shim")
    parser.add_argument("--exit-file", type=Path, required=True)
    parser.add_argument("--cwd", type=Path, default=None)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command")
    # A handler (not SIG_IGN): handlers are reset to the default in the exec'd workload, an
    # ignored signal would stay ignored there.
    signal.signal(signal.SIGTERM, _keep_waiting)
    signal.signal(signal.SIGINT, _keep_waiting)
    if args.cwd is not None and not args.cwd.is_dir():
        # said here, not as Popen's "No such file or directory", which reads as if the
        # command were missing
        print(
            f"fairlane shim: the working directory {str(args.cwd)!r} does not exist "
            "(--working-dir)",
            file=sys.stderr,
            flush=True,
        )
        write_exit_file(args.exit_file, CANNOT_EXECUTE)
        return CANNOT_EXECUTE
    try:
        child = _start(command, args.cwd, args.uid, args.gid)
    except subprocess.SubprocessError:  # the chdir as the workload's user was refused
        print(
            f"fairlane shim: the working directory {str(args.cwd)!r} cannot be entered by "
            "the workload's user (--working-dir)",
            file=sys.stderr,
            flush=True,
        )
        code = CANNOT_EXECUTE
    except FileNotFoundError as e:
        print(f"fairlane shim: {e}", file=sys.stderr, flush=True)
        code = COMMAND_NOT_FOUND
    except OSError as e:
        print(f"fairlane shim: {e}", file=sys.stderr, flush=True)
        code = CANNOT_EXECUTE
    else:
        code = exit_code_of(child.wait())
    write_exit_file(args.exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
