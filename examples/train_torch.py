"""The PyTorch version of examples/train.py: a training loop Fairlane can preempt and resume.

    python examples/train_torch.py [--steps 2000] [--checkpoint-every 100]

A small network learns y = sin(x) on the job's GPU where there is one (`CUDA_VISIBLE_DEVICES`
from the executor), else on the CPU. Every `--checkpoint-every` steps and on SIGTERM it saves
model, optimizer and step with `torch.save` to `$FAIRLANE_CHECKPOINT_DIR/model.pt` (written
to a temporary file and renamed, so a kill mid-save leaves the previous checkpoint whole), and
tells the job's timeline through `fairlane.workload`; a later attempt resumes from it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import torch

try:
    from fairlane import workload
except ImportError:  # run from a checkout: the repository root holds the `fairlane` package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fairlane import workload

stop_signal: int | None = None


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    global stop_signal  # noqa: PLW0603  (a signal handler has nowhere else to put it)
    stop_signal = signum


def save(path: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(
        {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp
    )
    os.replace(tmp, path)
    workload.checkpoint_saved(step=step, size_bytes=path.stat().st_size)
    print(f"checkpoint saved at step {step}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="STEPS")
    parser.add_argument("--report-every", type=int, default=20, metavar="STEPS")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(
        device
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = workload.checkpoint_dir() / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    step = 0
    if path.exists():
        saved = torch.load(path, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        print(f"attempt {workload.attempt()}: resumed from step {step} on {device}", flush=True)
        workload.message(f"resumed from step {step} on {device}")
    else:
        print(f"attempt {workload.attempt()}: starting from step 0 on {device}", flush=True)

    generator = torch.Generator(device="cpu").manual_seed(step)
    while step < args.steps:
        if stop_signal is not None:
            save(path, step, model, optimizer)
            print(f"stopping at step {step} (signal {stop_signal})", flush=True)
            return 128 + stop_signal
        x = (torch.rand(256, 1, generator=generator) * 6.28 - 3.14).to(device)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.report_every == 0:
            workload.progress(step=step, metrics={"loss": float(loss)})
        if step % args.checkpoint_every == 0:
            save(path, step, model, optimizer)
    if step % args.checkpoint_every:
        save(path, step, model, optimizer)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
