// A timeline entry in words: what happened, why, and for whom.

export const TYPE_NAMES = {
  JobSubmitted: "Submitted",
  JobAdmitted: "Admitted",
  JobRejected: "Rejected",
  JobNominated: "GPUs held for it",
  JobScheduled: "Scheduled",
  JobStarted: "Started",
  JobPreemptionRequested: "Preemption requested",
  JobPreempted: "Preempted",
  JobCheckpointed: "Checkpoint saved",
  JobProgress: "Progress",
  JobMessage: "Message",
  JobPaused: "Paused",
  JobResumed: "Resumed",
  JobCompleted: "Completed",
  JobFailed: "Failed",
  JobCancelled: "Deleted",
  JobPriorityChanged: "Priority changed",
};

/** The fold's own verdict: false only for what it refused (a decision the log had moved past,
 * a report about an attempt that had ended). */
export function takesEffect(e) {
  return e.applied;
}

const REASONS = {
  reclaim: "reclaim: another project took back GPUs within its fair share",
  priority: "priority: a more important job of its project needed the GPUs",
  pause: "pause: its user paused it",
  cancel: "cancel: its user deleted it",
  node_lost: "node lost: its node stopped answering",
  drain: "drain: an operator drained its node",
  shutdown: "shutdown: the cluster was shut down; it is queued again and resumes",
};

// a replica is written as [node, [gpu indexes]]
const nodesOf = (replicas) => [...new Set((replicas ?? []).map((r) => (Array.isArray(r) ? r[0] : r.node)))].join(", ");

/** The entry's story, as text and links (jobLink makes a link to another job). */
// The attempt's mean GPU utilization, as its executor sampled it (absent where NVML was not).
function utilization(ev) {
  const value = ev.gpu_utilization;
  return value === undefined || value === null ? "" : `; GPU utilization ${Math.round(value)}% on average`;
}

export function describe(e, jobLink) {
  const ev = e.event;
  const by = e.actor ? ` by ${e.actor}` : "";
  const reason = e.reason ? REASONS[e.reason] ?? e.reason : null;
  const forJob = e.for_job ? [" for ", jobLink(e.for_job)] : [];
  switch (e.type) {
    case "JobSubmitted":
      return `${ev.spec?.gpus ?? 1} GPU(s) × ${ev.spec?.replicas ?? 1} in project ${ev.spec?.project}${by}`;
    case "JobAdmitted":
      return `priority ${ev.priority}, ${ev.preemptible ? "preemptible" : "not preemptible"}, pools ${(ev.pools ?? []).join(", ")}`;
    case "JobRejected":
      return ev.reason;
    case "JobNominated":
      if (!ev.victims?.length) return `GPUs on their way back are held for it (${e.reason ?? ev.reason})`;
      return ["GPUs that ", ev.victims.flatMap((v, i) => [i ? ", " : "", jobLink(v)]),
        ` ${ev.victims.length === 1 ? "is" : "are"} giving up are held for it (${e.reason ?? ev.reason})`];
    case "JobScheduled":
      return `attempt ${ev.attempt} on ${nodesOf(ev.replicas)} in pool ${ev.pool}${ev.note ? ` (${ev.note})` : ""}`;
    case "JobStarted":
      return `attempt ${ev.attempt}${ev.resumed ? ", resumed from its checkpoint" : ""}`;
    case "JobPreemptionRequested":
      return [`attempt ${ev.attempt}: ${reason}`, ...forJob,
        ev.facts?.note ? ` (${ev.facts.note})` : ""];
    case "JobPreempted":
      return `attempt ${ev.attempt} stopped${ev.own_replicas && ev.node ? ` on ${ev.node}` : ""}: ${reason}${ev.checkpointed ? ", checkpointed" : ", no checkpoint"}${ev.killed ? ", killed after its grace period" : ""}${utilization(ev)}`;
    case "JobCheckpointed":
      return `attempt ${ev.attempt}${ev.step !== undefined ? `, step ${ev.step}` : ""}${ev.save_s ? ` in ${ev.save_s.toFixed(1)}s` : ""}`;
    case "JobProgress":
      return [`attempt ${ev.attempt}`, ev.step !== undefined ? `, step ${ev.step}` : "",
        ev.epoch !== undefined ? `, epoch ${ev.epoch}` : "",
        Object.entries(ev.metrics ?? {}).map(([k, v]) => `, ${k} ${Number(v).toPrecision(4)}`)];
    case "JobMessage":
      return `attempt ${ev.attempt}: ${ev.text}`;
    case "JobPaused":
    case "JobResumed":
    case "JobCancelled":
      return by.trim() || "—";
    case "JobCompleted":
      return `attempt ${ev.attempt}${utilization(ev)}`;
    case "JobFailed":
      return `attempt ${ev.attempt}, exit status ${ev.exit_code ?? 1}${ev.reason ? `: ${ev.reason}` : ""}${utilization(ev)}`;
    case "JobPriorityChanged":
      return `now ${ev.priority}${by}`;
    default:
      return [reason ?? "", ...forJob];
  }
}
