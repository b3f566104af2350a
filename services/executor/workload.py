"""The built-in workload: a small program that behaves like a training job.

`python -m services.executor.workload [--checkpoint-every S] [--step-seconds S]`

- Every `--step-seconds` (1 s) it takes one step: a counter goes up by one.
- Every `--checkpoint-every` seconds (5 s) it saves: the counter goes to
  `$FAIRLANE_CHECKPOINT_DIR/state.json` and `.checkpoint` is touched (the executor turns that
  into a `JobCheckpointed` event).
- On an attempt after a preemption (`FAIRLANE_RESUMED=1`) it starts from the saved counter.
- SIGTERM (or SIGINT) means: save now and exit 143 (130), as a real trainer would within the
  grace period.
- When `.exit` appears in `$FAIRLANE_CHECKPOINT_DIR` or in the job's folder above it (polled
  every 0.1 s) it saves and exits with the code written there: the live scenario engine
  completes a job with `0`, fails it with `1`, writing the job's folder once for all replicas.

Every replica saves its own state (each has a checkpoint folder of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

POLL_S = 0.1


class Trainer:
    def __init__(self, directory: Path, checkpoint_every: float, step_seconds: float) -> None:
        self.dir = directory
        self.checkpoint_every = checkpoint_every
        self.step_seconds = step_seconds
        self.attempt = int(os.environ.get("FAIRLANE_ATTEMPT", "1"))
        self.step = 0
        self.resumed_from: int | None = None
        if os.environ.get("FAIRLANE_RESUMED") == "1":
            saved = self._load()
            if saved is not None:
                self.step = self.resumed_from = int(saved.get("step", 0))
        self.signalled: int | None = None

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def _load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save(self) -> None:
        state = {"step": self.step, "attempt": self.attempt, "resumed_from": self.resumed_from}
        tmp = self.state_file.with_name("state.json.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)
        (self.dir / ".checkpoint").touch()

    def requested_exit(self) -> int | None:
        for folder in (self.dir, self.dir.parent):
            try:
                text = (folder / ".exit").read_text().strip()
            except OSError:
                continue
            break
        else:
            return None
        try:
            return int(text)
        except ValueError:
            return 1

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = signum

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        start = time.monotonic()
        next_step = start + self.step_seconds
        next_save = start + self.checkpoint_every
        print(f"training: attempt {self.attempt}, from step {self.step}", flush=True)
        while True:
            if self.signalled is not None:
                self.save()
                print(f"stopping at step {self.step}: saved", flush=True)
                return 128 + self.signalled
            code = self.requested_exit()
            if code is not None:
                self.save()
                print(f"done at step {self.step}: exit {code}", flush=True)
                return code
            now = time.monotonic()
            while now >= next_step:
                self.step += 1
                next_step += self.step_seconds
            if self.checkpoint_every > 0 and now >= next_save:
                self.save()
                next_save = now + self.checkpoint_every
            time.sleep(min(POLL_S, max(0.0, next_step - now)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.executor.workload")
    parser.add_argument("--checkpoint-every", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--step-seconds", type=float, default=1.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    directory = Path(os.environ.get("FAIRLANE_CHECKPOINT_DIR", "."))
    directory.mkdir(parents=True, exist_ok=True)
    return Trainer(directory, args.checkpoint_every, args.step_seconds).run()


if __name__ == "__main__":
    sys.exit(main())
