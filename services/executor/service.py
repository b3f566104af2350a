"""The node executor: runs the replicas the log places on this node, and reports what happened.

One executor per node. It reads only its own node's work, `fl-work.<node>` in the relay stream
beside the log (services/runtime/relays.py): the events the fold applied that concern this node,
relayed by the node watcher's leader after the fold refereed them (a placement the fold refused is
never relayed), each with the jobs it concerns as the fold left them (services/nodewatch/work.py).
It replays that into a `NodeWork`, reconciles with what its earlier self left running, registers the
node (only a node that knows what runs on it offers itself for work), then follows the live tail and
reacts to each relayed event with its node's work as it is right after that event:

- `JobScheduled` for replicas on this node: start one workload per replica; the executor of the
  job's first replica reports `JobStarted`.
- `JobPreemptionRequested`: SIGTERM the replicas being taken back, SIGKILL after the grace
  period; each node reports `JobPreempted` for its own once they are gone and stored.
- a workload that ends by itself: any non-zero exit is `JobFailed` (reported by whichever
  executor saw it; the id is the same, so a second report is dropped); all replicas on the
  first replica's node exiting 0 is `JobCompleted`.
- `.checkpoint` in the job's checkpoint folder being touched: `JobCheckpointed` (its time is
  the marker's mtime); the workload's own events through the endpoint (`JobProgress`,
  `JobCheckpointed` with step and size, `JobMessage`), checked against the attempt's token.
- every `--gpu-sample` seconds: its GPUs sampled through NVML into the GPU samples bucket
  (not the log), with each job's utilization and idle flag; the attempt's mean utilization
  goes on the event that ends it (`gpu_utilization`).
- `NodeLost` for this node: everything here is stopped, then the node registers again.
- a shut down (`--shutdown-on-exit`, what `fairlane down` stops): every job here is stopped as a
  preemption does and reported `JobPreempted(reason="shutdown")`, so it is queued again; a
  report that could not be made is made by the next executor on the node (`shutdown`).
- after a restart: workloads it started earlier (recorded, or containers found by label) are
  adopted if still alive; those that ended meanwhile are reported from the exit status their
  shim (or the engine) kept; one that left none (a reboot) is reported as
  `JobPreempted(reason="node_lost")`, so the job is queued again and resumes.
- anything the log says should no longer run here (the job completed or failed elsewhere, a
  preemption reported by another node, this node lost) is stopped without a report.

Every id it publishes is derived from the job, the attempt and what happened, so an executor
that restarts and reports the same thing again is deduplicated by the stream.

In-process use (the live scenario engine, benchmarks):

    executor = Executor(eventlog, ExecutorConfig(node="n0", pool="default", gpus=8))
    task = asyncio.create_task(executor.run(ready))   # ready: an asyncio.Event
    ...
    executor.stop(); await task                       # or task.cancel()

    group = ExecutorGroup(eventlog, [Executor(eventlog, ExecutorConfig(..., hollow=True))
                                     for ...])        # 100 hollow nodes, one connection
    await group.run(ready)

The parts, one idea each: `config`, `nodework` (its node's work, folded), `facts` (what runs
here, as plain data), `plan` (the decisions, pure: work and facts in, actions out),
`actuator` (the actions carried out, and what happened made facts; its parts `inventory`,
`starting`, `watching`, `checkpointing`, `takeup`), `launch` (a replica's
launch and environment, pure), `gang` (the rendezvous), `shutdown` (the shut down's file),
`executor` (one node: fold, plan, act; its heartbeat), `group` (the reading and the dispatch,
for one or many executors), `runtime` (the seam; processes, hollow), `docker` (containers),
`logs` (where each attempt's output is kept), `logship`, `endpoint` and `workload_events`
(events from workloads), `gpus` (NVML or declared), `sampling` (the GPUs' utilization,
memory, temperature and power, off the log; idle jobs).
"""

from services.executor.config import ExecutorConfig
from services.executor.executor import Executor
from services.executor.group import ExecutorGroup

__all__ = ["Executor", "ExecutorConfig", "ExecutorGroup"]
