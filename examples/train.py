"""A plain-Python training loop that Fairlane can preempt and resume.

    python examples/train.py [--steps 2000] [--step-seconds 0.01] [--checkpoint-every 100]

It fits y = 3x + 2 by stochastic gradient descent, standard library only. Every
`--checkpoint-every` steps, and when it gets SIGTERM (Fairlane preempting it), it saves its
state to `$FAIRLANE_CHECKPOINT_DIR/train.json` and says so on the job's timeline; a later
attempt resumes from that file. Progress (step, loss) goes on the timeline too, through
`fairlane.workload`. It exits 0 once `--steps` are done, 143 after saving on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType

try:
    from fairlane import workload
except ImportError:  # run from a checkout: the repository root holds the `fairlane` package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fairlane import workload


class Model:
    """y = w x + b, trained one sample at a time."""

    def __init__(self, w: float = 0.0, b: float = 0.0) -> None:
        self.w, self.b = w, b

    def step(self, rng: random.Random, rate: float = 0.05) -> float:
        x = rng.uniform(-1.0, 1.0)
        y = 3.0 * x + 2.0 + rng.gauss(0.0, 0.01)
        error = self.w * x + self.b - y
        self.w -= rate * error * x
        self.b -= rate * error
        return error * error


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.file = workload.checkpoint_dir() / "train.json"
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.model = Model()
        self.step = 0
        self.stop_signal: int | None = None
        saved = self.load()
        if saved is not None:
            self.step = int(saved["step"])
            self.model = Model(float(saved["w"]), float(saved["b"]))
        self.rng = random.Random(self.step)

    def load(self) -> dict[str, float] | None:
        try:
            data: dict[str, float] = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return None
        return data

    def save(self) -> None:
        tmp = self.file.with_name(self.file.name + ".tmp")
        tmp.write_text(json.dumps({"step": self.step, "w": self.model.w, "b": self.model.b}))
        os.replace(tmp, self.file)
        workload.checkpoint_saved(step=self.step, size_bytes=self.file.stat().st_size)
        print(f"checkpoint saved at step {self.step}", flush=True)

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = signum

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if self.step:
            print(f"attempt {workload.attempt()}: resumed from step {self.step}", flush=True)
            workload.message(f"resumed from step {self.step}")
        else:
            print(f"attempt {workload.attempt()}: starting from step 0", flush=True)
        loss = 0.0
        while self.step < self.args.steps:
            if self.stop_signal is not None:
                self.save()
                print(f"stopping at step {self.step} (signal {self.stop_signal})", flush=True)
                return 128 + self.stop_signal
            loss = self.model.step(self.rng)
            self.step += 1
            if self.step % self.args.report_every == 0:
                workload.progress(step=self.step, metrics={"loss": loss, "w": self.model.w})
            if self.step % self.args.checkpoint_every == 0:
                self.save()
            time.sleep(self.args.step_seconds)
        if self.step % self.args.checkpoint_every:
            self.save()
        print(f"done at step {self.step}: w={self.model.w:.3f} b={self.model.b:.3f}", flush=True)
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-seconds", type=float, default=0.01)
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="STEPS")
    parser.add_argument("--report-every", type=int, default=20, metavar="STEPS")
    return Trainer(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
