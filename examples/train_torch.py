"""The PyTorch version of examples/train.py: a training loop Fairlane can preempt and resume.

    python examples/train_torch.py [--steps 2000] [--checkpoint-every 100]

A small network learns y = sin(x) on the job's GPU where there is one (`CUDA_VISIBLE_DEVICES`
from the executor), else on the CPU. Every `--checkpoint-every` steps and on SIGTERM it saves
model, optimizer and step with `torch.save` to `$FAIRLANE_CHECKPOINT_DIR/model.pt` (written
to a temporary file and renamed, so a kill mid-save leaves the previous checkpoint whole), and
tells the job's timeline through `fairlane.workload`; a later attempt resumes from it.

As a gang (`fairlane submit --replicas 2 ...`) it trains data-parallel with torch.distributed:
each replica joins the process group at the `MASTER_ADDR:MASTER_PORT` the executor gives every
replica of the attempt (`WORLD_SIZE`, `RANK`: `env://`), over NCCL on GPUs and gloo on CPUs
(`--backend gloo` on GPUs too: NCCL refuses two replicas on one GPU, as when two nodes of one
machine share it), and wraps the network in DistributedDataParallel. The replicas agree on when
to stop (a SIGTERM on any of them stops all at the same step) and each saves to its own
checkpoint folder, so every replica resumes from the same step, wherever it runs next.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

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
        # the network itself, not DistributedDataParallel's wrapper (its names say `module.`)
        {
            "step": step,
            "model": getattr(model, "module", model).state_dict(),
            "optimizer": optimizer.state_dict(),
        },
        tmp,
    )
    os.replace(tmp, path)
    workload.checkpoint_saved(step=step, size_bytes=path.stat().st_size)
    print(f"checkpoint saved at step {step}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="STEPS")
    parser.add_argument("--report-every", type=int, default=20, metavar="STEPS")
    parser.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="a gang's torch.distributed backend (default: nccl on GPUs, gloo on CPUs)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    world = join(backend)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
    ).to(device)
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

    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    rank = dist.get_rank() if world > 1 else 0
    generator = torch.Generator(device="cpu").manual_seed(step * world + rank)
    while step < args.steps:
        if stopping(world, device if backend == "nccl" else torch.device("cpu")):
            save(path, step, model, optimizer)
            signum = stop_signal or signal.SIGTERM  # or another replica got it
            print(f"stopping at step {step} (signal {signum})", flush=True)
            if world > 1:
                dist.destroy_process_group()
            return 128 + signum
        x = (torch.rand(256, 1, generator=generator) * 6.28 - 3.14).to(device)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.report_every == 0:
            workload.progress(step=step, metrics={"loss": loss.detach().item()})
        if step % args.checkpoint_every == 0:
            save(path, step, model, optimizer)
    if step % args.checkpoint_every:
        save(path, step, model, optimizer)
    print(f"done at step {step}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


def join(backend: str) -> int:
    """Join the gang's process group where there is a gang; its size (1: alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # env:// reads MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK
        dist.init_process_group(backend)
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        print(f"rank {dist.get_rank()} of {world} met at {where} over {backend}", flush=True)
    return world


def stopping(world: int, device: torch.device) -> bool:
    """Whether to save and stop now: this replica got SIGTERM, or (in a gang) any replica did,
    so all stop after the same step instead of one waiting for the others' gradients. `device`
    is where the backend reduces: the GPU for NCCL, the CPU for gloo."""
    if world == 1:
        return stop_signal is not None
    flag = torch.tensor([0 if stop_signal is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if __name__ == "__main__":
    sys.exit(main())
