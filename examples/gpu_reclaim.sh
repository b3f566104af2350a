#!/bin/bash
# Reclaim on a real GPU, end to end, on a machine with an NVIDIA GPU and PyTorch:
#
#   examples/gpu_reclaim.sh [DATA_DIR]
#
# `fairlane up` finds the GPU with NVML; project research (quota 0) borrows it for
# examples/train_torch.py; project prod (quota 1) submits a job, the scheduler reclaims the GPU,
# the example checkpoints on SIGTERM, prod's job runs, and the example resumes from its
# checkpoint. Prints the timelines and the audit, then stops the cluster. `fairlane` and the
# workloads' `python3` are taken from PATH (FAIRLANE and PYTHON override them).
set -euo pipefail
FL=${FAIRLANE:-fairlane}
PY=${PYTHON:-python3}
D=${1:-/tmp/fairlane-gpu-reclaim}
C=(--data-dir "$D")
HERE=$(cd "$(dirname "$0")" && pwd)
state() { $FL describe "$1" -o json "${C[@]}" | $PY -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], j["attempt"])'; }
checkpoints() { $FL describe "$1" --events -o json "${C[@]}" | $PY -c 'import json,sys; print(sum(e["type"]=="JobCheckpointed" for e in json.load(sys.stdin)["events"]))'; }

$FL up --detach "${C[@]}"
trap '$FL down "${C[@]}"' EXIT
$FL nodes "${C[@]}"
$FL project set research --quota 0 --weight 1 "${C[@]}"
$FL project set prod --quota 1 "${C[@]}"
$FL submit borrow --project research --class train --gpus 1 "${C[@]}" -- \
    "$PY" "$HERE/train_torch.py" --steps 100000000 --checkpoint-every 500
for _ in $(seq 120); do [ "$(checkpoints borrow)" -ge 2 ] && break; sleep 1; done
$FL submit urgent --project prod --class train --gpus 1 "${C[@]}" -- "$PY" -c '
import time, torch
a = torch.randn(8192, 8192, device="cuda"); t = time.time()
for _ in range(300): b = a @ a
torch.cuda.synchronize()
print("urgent: 300 matmuls of 8192^2 in", round(time.time() - t, 2), "s on", torch.cuda.get_device_name(0))'
for _ in $(seq 180); do
  [ "$(state urgent)" = "completed 1" ] && [ "$(state borrow)" = "running 2" ] && break
  sleep 1
done
sleep 15  # the resumed attempt loads PyTorch and says where it resumed from
$FL list "${C[@]}"
$FL describe urgent --events "${C[@]}"
$FL logs urgent "${C[@]}"
$FL describe borrow --events "${C[@]}" | grep -v JobProgress
$FL audit "${C[@]}"
