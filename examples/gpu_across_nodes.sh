#!/bin/bash
# Work moving between nodes, on a machine with one NVIDIA GPU and PyTorch:
#
#   examples/gpu_across_nodes.sh [DATA_DIR]
#
# `fairlane up --nodes 2 --gpus 1` runs two node executors on this machine, each declaring
# GPU 0 as its own (so both share the one GPU, and NVML samples it for both):
#
# 1. Reclaim that moves a job. Project research (quota 0) borrows a GPU for
#    examples/train_torch.py; the other node is cordoned; project prod (quota 1) submits
#    `urgent`, which takes the borrowed GPU back: the example saves a checkpoint on SIGTERM.
#    The other node is put back in service and the example resumes there, from the checkpoint
#    its first node stored in the cluster's checkpoint store.
# 2. GPU utilization: while `urgent` multiplies matrices, `fairlane nodes` shows each node's
#    GPU readings from NVML.
# 3. A gang over both nodes: two replicas of the example train data-parallel with
#    torch.distributed (gloo: NCCL refuses two ranks on one GPU), are paused together, and
#    resume from the same step.
#
# Prints the timelines, logs and the audit, then stops the cluster. `fairlane` and the
# workloads' `python3` are taken from PATH (FAIRLANE and PYTHON override them); UP_FLAGS adds
# flags to `fairlane up`.
set -euo pipefail
FL=${FAIRLANE:-fairlane}
PY=${PYTHON:-python3}
D=${1:-/tmp/fairlane-gpu-nodes}
C=(--data-dir "$D")
HERE=$(cd "$(dirname "$0")" && pwd)
TRAIN=("$PY" "$HERE/train_torch.py" --steps 100000000 --checkpoint-every 500)
export FAIRLANE_GPU_SAMPLE=${FAIRLANE_GPU_SAMPLE:-1}  # a reading a second, for this short run

field() {  # field JOB EXPRESSION: EXPRESSION over the job's description `j`
  $FL describe "$1" -o json "${C[@]}" | $PY -c "import json,sys; j=json.load(sys.stdin); print($2)"
}
events() {  # events JOB TYPE: how many TYPE events the job's timeline has
  $FL describe "$1" --events -o json "${C[@]}" |
    $PY -c "import json,sys; print(sum(e['type']=='$2' for e in json.load(sys.stdin)['events']))"
}
said() {  # said JOB WORDS: how many lines of the job's output hold WORDS
  { $FL logs "$1" "${C[@]}" 2>/dev/null || true; } | grep -c -- "$2" || true
}
until_true() {  # until_true SECONDS JOB WHAT COMMAND...: fail, naming WHAT, if it never holds
  local seconds=$1 job=$2 what=$3
  shift 3
  for _ in $(seq "$seconds"); do
    if [ "$("$@")" = true ]; then return 0; fi
    if [ "$(field "$job" 'j["state"]')" = failed ]; then
      $FL describe "$job" --events "${C[@]}"
      echo "$job failed while waiting for: $what" >&2
      return 1
    fi
    sleep 1
  done
  echo "gave up after ${seconds}s waiting for: $what" >&2
  return 1
}
state_is() { [ "$(field "$1" 'j["state"], j["attempt"]')" = "$2" ] && echo true || echo false; }
at_least() { [ "$("${@:2}")" -ge "$1" ] && echo true || echo false; }
step() { printf '\n== %s\n' "$*"; }

# shellcheck disable=SC2086  # UP_FLAGS is a list of flags
$FL up --detach --nodes 2 --gpus 1 ${UP_FLAGS:-} "${C[@]}"
trap '$FL down "${C[@]}"' EXIT
$FL project set research --quota 0 --weight 1 "${C[@]}"
$FL project set prod --quota 1 "${C[@]}"

step "1. research borrows a GPU"
$FL submit borrow --project research --class train --gpus 1 "${C[@]}" -- "${TRAIN[@]}"
until_true 180 borrow "borrow's second checkpoint" at_least 2 events borrow JobCheckpointed
first=$(field borrow 'j["nodes"][0]')
other=$($FL nodes -o json "${C[@]}" | $PY -c "
import json,sys; print(*[n['node'] for n in json.load(sys.stdin) if n['node'] != '$first'])")
echo "borrow runs on $first; $other is cordoned, so a reclaim must take borrow's GPU"
$FL node cordon "$other" --reason "so that urgent reclaims" "${C[@]}"

step "2. prod takes it back; NVML sees urgent's matrix products"
$FL submit urgent --project prod --class train --gpus 1 "${C[@]}" -- "$PY" -c '
import time, torch
on = "cuda" if torch.cuda.is_available() else "cpu"
a = torch.randn(8192, 8192, device=on); start = time.time(); n = 0
while time.time() - start < 20:
    b = a @ a; n += 1
    if on == "cuda" and n % 100 == 0: torch.cuda.synchronize()
if on == "cuda": torch.cuda.synchronize()
name = torch.cuda.get_device_name(0) if on == "cuda" else "the CPU"
print("urgent:", n, "matmuls of 8192^2 in", round(time.time() - start, 1), "s on", name)'
until_true 120 urgent "urgent running" state_is urgent "running 1"
sleep 8  # a few readings while it multiplies
$FL nodes "${C[@]}"
$FL nodes -o json "${C[@]}"

step "3. $other back in service: borrow resumes there"
$FL node uncordon "$other" "${C[@]}"
until_true 120 borrow "borrow running again" state_is borrow "running 2"
echo "borrow attempt 2 runs on $(field borrow 'j["nodes"][0]') (attempt 1 ran on $first)"
until_true 120 borrow "borrow saying where it resumed" at_least 1 said borrow "resumed from step"
until_true 120 urgent "urgent completed" state_is urgent "completed 1"
$FL describe urgent --events "${C[@]}"
$FL logs urgent "${C[@]}"
$FL describe borrow --events "${C[@]}" | grep -v JobProgress
$FL logs borrow "${C[@]}" | grep -v "checkpoint saved"
$FL delete borrow "${C[@]}"
until_true 60 borrow "borrow deleted" state_is borrow "cancelled 2"

step "4. a gang of two replicas, one on each node, over torch.distributed"
$FL submit dist --project prod --class train --gpus 1 --replicas 2 "${C[@]}" -- \
  "${TRAIN[@]}" --backend gloo
until_true 180 dist "both replicas meeting" at_least 2 said dist " met at "
until_true 180 dist "the gang's checkpoint" at_least 1 events dist JobCheckpointed
$FL pause dist "${C[@]}"
until_true 120 dist "dist paused" state_is dist "paused 1"
$FL resume dist "${C[@]}"
until_true 120 dist "dist running again" state_is dist "running 2"
until_true 180 dist "both replicas resuming" at_least 2 said dist "resumed from step"
$FL describe dist --events "${C[@]}" | grep -v JobProgress
$FL logs dist "${C[@]}" | grep -v "checkpoint saved"
$FL delete dist "${C[@]}"

step "5. every decision re-derived from the log"
$FL list "${C[@]}"
$FL audit "${C[@]}"
