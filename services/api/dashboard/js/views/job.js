// One job: its standing, why it waits, what it made room for or lost, its attempts, checkpoints
// and progress, its whole timeline with reasons, its logs, and the buttons that act on it.

import { del, get, post, request } from "../api.js";
import { bytes, duration, h, jobLink, problem, replace, s, stateBadge, table, time } from "../dom.js";
import { idleBadge, percent } from "./nodes.js";
import { describe, takesEffect, TYPE_NAMES } from "./timeline.js";

const TIMELINE_MAX = 5000;
const CHECKPOINTS_SHOWN = 10;
const FINISHED = ["completed", "failed", "cancelled", "rejected"];
const ACTIONS = {
  pause: { label: "Pause", when: ["submitted", "pending", "starting", "running"], done: "paused" },
  resume: { label: "Resume", when: ["paused"], done: "resumed" },
  delete: { label: "Delete", when: ["submitted", "pending", "starting", "running", "stopping", "paused"], done: "deleted" },
};

export function mount(main, ctx, { jobId }) {
  const path = `/v1/jobs/${encodeURIComponent(jobId)}`;
  const heading = h("h1", { tabindex: -1 }, `Job ${jobId}`);
  const badge = h("span", { class: "heading-state" });
  const summary = h("div", {});
  const outcome = h("div", { class: "outcome", role: "status", "aria-live": "polite" });
  const buttons = Object.fromEntries(Object.entries(ACTIONS).map(([name, action]) =>
    [name, h("button", { type: "button", id: `action-${name}`, class: name === "delete" ? "danger" : "", disabled: true,
      onclick: () => (name === "delete" ? askToDelete() : act(name)) }, action.label)]));
  const actions = h("div", { class: "actions", role: "group", "aria-label": "Act on this job" },
    Object.values(buttons), h("p", { class: "help", id: "actions-help" }));
  const confirmDelete = h("dialog", { "aria-labelledby": "confirm-title" },
    h("form", { method: "dialog" },
      h("h2", { id: "confirm-title" }, `Delete job ${jobId}?`),
      h("p", {}, "It is stopped if it runs, and cannot be resumed."),
      h("div", { class: "actions" },
        h("button", { value: "delete", class: "danger", id: "confirm-delete" }, "Delete"),
        h("button", { value: "keep", autofocus: true }, "Keep it"))));
  function askToDelete() {
    confirmDelete.returnValue = ""; // Escape closes it without a value: keep it from the last time
    confirmDelete.showModal();
  }
  confirmDelete.addEventListener("close", () => {
    if (confirmDelete.returnValue === "delete") act("delete");
    else buttons.delete.focus();
  });
  const sections = h("div", {});
  const logs = logsSection(path);
  const showProgress = h("input", { type: "checkbox", id: "show-progress" });
  const timelineBox = h("div", {});
  let job = null;
  let timeline = [];
  let truncated = false;

  async function act(name) {
    replace(outcome);
    Object.values(buttons).forEach((b) => { b.disabled = true; });
    try {
      await (name === "delete" ? del(path) : post(`${path}/${name}`));
      replace(outcome, h("p", { class: "ok" }, `${ACTIONS[name].done[0].toUpperCase()}${ACTIONS[name].done.slice(1)}: job ${jobId}.`));
      ctx.announce(`Job ${jobId} ${ACTIONS[name].done}.`);
    } catch (error) {
      replace(outcome, problem(error));
      if (error.status === 401) ctx.onUnauthorized();
    }
    await view.refresh();
  }

  function renderActions() {
    const allowed = ctx.mayAct(job.project);
    for (const [name, action] of Object.entries(ACTIONS)) {
      buttons[name].disabled = !allowed || !action.when.includes(job.state);
    }
    actions.querySelector("#actions-help").textContent = allowed
      ? (FINISHED.includes(job.state) ? `The job is ${job.state}: nothing to do.` : "")
      : `Your token may not act on project ${job.project}.`;
  }

  function renderTimeline() {
    const items = timeline.filter((e) => showProgress.checked || e.type !== "JobProgress");
    // what someone opened stays open when the timeline is drawn anew
    const open = new Set([...timelineBox.querySelectorAll("li[data-seq] > details[open]")]
      .map((d) => d.parentElement.dataset.seq));
    replace(timelineBox,
      h("ol", { class: "timeline", id: "timeline" }, items.map((e) => entry(e, open.has(String(e.seq))))),
      truncated ? h("p", { class: "help" }, `Only the first ${TIMELINE_MAX} events are shown.`) : null);
  }
  showProgress.addEventListener("change", renderTimeline);

  replace(main, h("div", { class: "job-head" }, heading, badge), summary);

  const view = {
    title: `Job ${jobId}`,
    async refresh() {
      try {
        job = await get(path);
      } catch (error) {
        if (error.status === 403) {  // another project's job: the API does not show it
          replace(summary, h("p", { class: "empty" },
            `Job ${jobId} belongs to a project your token does not cover (${error.message}).`));
          return;
        }
        replace(summary, error.status === 404 ? h("p", { class: "empty" }, `There is no job ${jobId}.`) : problem(error));
        if (error.status === 401) throw error;
        return;
      }
      if (!ctx.visible(job.project)) {
        replace(badge);
        replace(summary, h("p", { class: "empty" },
          `Job ${jobId} belongs to project ${job.project}, which your token does not cover.`));
        return;
      }
      if (summary.firstChild !== actions) {
        replace(summary, actions, outcome, confirmDelete, sections,
          h("section", { class: "card", "aria-labelledby": "timeline-title" },
            h("h2", { id: "timeline-title" }, "Timeline"),
            h("p", { class: "toggle" }, showProgress, h("label", { for: "show-progress" }, " Show workload progress reports")),
            timelineBox),
          logs.element);
      }
      replace(badge, stateBadge(job.state));
      renderActions();
      await loadTimeline();
      const [gpus, ...preemptions] = await Promise.all([
        get("/v1/gpus").catch(() => ({ jobs: [] })), // an API without GPU samples: unknown
        get("/v1/preemptions", { victim: jobId }),
        get("/v1/preemptions", { beneficiary: jobId }),
      ]);
      const usage = gpus.jobs.find((j) => j.job_id === jobId) ?? null;
      replace(badge, stateBadge(job.state), usage?.idle ? [" ", idleBadge()] : null);
      replace(sections, details(job, timeline, usage, ...preemptions));
      renderTimeline();
      logs.attempts(job.attempt);
    },
  };

  async function loadTimeline() {
    // entries never change once projected: fetch only what is new
    while (timeline.length < TIMELINE_MAX) {
      const after = timeline.length ? timeline[timeline.length - 1].seq : undefined;
      const page = await get(`${path}/timeline`, { after, limit: 500 });
      timeline.push(...page.items);
      if (page.next === null) break;
    }
    truncated = timeline.length >= TIMELINE_MAX;
  }

  return view;
}

function failure(timeline) {
  const failed = timeline.filter((e) => e.type === "JobFailed" && takesEffect(e)).pop();
  if (!failed) return null;
  return h("section", { class: "card failure", "aria-labelledby": "failure-title" },
    h("h2", { id: "failure-title" }, "Why it failed"),
    h("p", { "data-exit-code": failed.event.exit_code ?? 1 },
      `Attempt ${failed.event.attempt} exited with code ${failed.event.exit_code ?? 1}`,
      failed.event.reason ? `: ${failed.event.reason}` : ".", " (", time(failed.time), ")"));
}

function gpuFact(job, usage) {
  if (job.gpus_held === 0) return null;
  const now = usage ? percent(usage.utilization) : "unknown";
  return fact("GPU utilization", h("span", { id: "gpu-utilization" }, now,
    usage?.average !== null && usage?.average !== undefined ? ` now, ${percent(usage.average)} over this attempt` : "",
    usage?.idle ? [" ", idleBadge(), " since ", time(usage.idle_since)] : ""));
}

function details(job, timeline, usage, lost, gained) {
  return [
    job.state === "failed" ? failure(timeline) : null,
    job.pending_reason ? h("section", { class: "card why-waits", "aria-labelledby": "why-title" },
      h("h2", { id: "why-title" }, job.state === "paused" ? "Paused" : "Why it waits"),
      h("p", { "data-code": job.pending_reason.code }, job.pending_reason.message)) : null,
    job.reject_reason ? h("p", { class: "error" }, `Rejected: ${job.reject_reason}`) : null,
    h("dl", { class: "facts" },
      fact("Project", h("a", { href: `#/jobs?project=${encodeURIComponent(job.project)}` }, job.project)),
      fact("Pool", job.pool ?? "none yet"),
      fact("GPUs", `${job.gpus} × ${job.replicas} replica${job.replicas === 1 ? "" : "s"} (at least ${job.min_replicas}); holds ${job.gpus_held}`),
      fact("Priority", `${job.priority}${job.preemptible ? ", preemptible" : ", not preemptible"}`),
      fact("Attempt", job.attempt),
      fact("Preempted", `${job.preemptions} time${job.preemptions === 1 ? "" : "s"}`),
      fact("Nodes", job.nodes.join(", ") || "—"),
      (job.ports ?? []).length ? fact("Ports", job.ports.join(", ")) : null,
      (job.ports ?? []).length ? fact("URL", urlLinks(job)) : null,
      (job.volumes ?? []).length ? fact("Volumes", job.volumes.join(", ")) : null,
      fact("Submitted", time(job.submitted_at)),
      fact("Queued", duration(job.queued_s)),
      fact("Ran", duration(job.running_s)),
      fact("GPU hours", job.gpu_hours.toFixed(3)),
      gpuFact(job, usage)),
    preemptionSection(lost, gained),
    attemptsSection(timeline),
    progressSection(timeline),
  ];
}

/** Where a job's published ports are reached, as links (or a dash while it runs nowhere). */
export function urlLinks(job) {
  const urls = job.urls ?? [];
  if (!urls.length) return "—";
  return urls.flatMap((u, i) => [i ? " " : null, h("a", { href: u, target: "_blank", rel: "noopener" }, u)]);
}

function fact(name, value) {
  return h("div", {}, h("dt", {}, name), h("dd", {}, value));
}

function preemptionSection(lost, gained) {
  if (lost.length === 0 && gained.length === 0) return null;
  return h("section", { class: "card", "aria-labelledby": "preemptions-title" },
    h("h2", { id: "preemptions-title" }, "Preemptions"),
    lost.length ? table("Preemptions of this job", [["Attempt", "num"], "Reason", "Made room for", ["Asked", "wide"], "Stopped", "Checkpointed", ["Work lost", "num wide"]],
      lost.map((p) => h("tr", { "data-for-job": p.beneficiary ?? "" },
        h("td", { class: "num" }, p.attempt), h("td", {}, p.reason),
        h("td", {}, p.beneficiary ? jobLink(p.beneficiary) : "—"),
        h("td", { class: "wide" }, time(p.requested_at)), h("td", {}, time(p.preempted_at)),
        h("td", {}, p.checkpointed === null ? "—" : p.checkpointed ? "yes" : "no"),
        h("td", { class: "num wide" }, p.work_lost_gpu_s === null ? "—" : `${p.work_lost_gpu_s.toFixed(0)} GPU·s`))),
    { class: "lost" }) : null,
    gained.length ? table("Jobs preempted to make room for this one", ["Job", ["Attempt", "num"], "Reason", ["GPUs", "num"], "Asked"],
      gained.map((p) => h("tr", {}, h("td", {}, jobLink(p.victim)), h("td", { class: "num" }, p.attempt),
        h("td", {}, p.reason), h("td", { class: "num" }, p.gpus), h("td", {}, time(p.requested_at)))),
    { class: "gained" }) : null);
}

function attemptsOf(timeline) {
  const attempts = new Map();
  const at = (n) => {
    if (!attempts.has(n)) attempts.set(n, { n, checkpoints: [], step: null });
    return attempts.get(n);
  };
  for (const e of timeline) {
    const n = e.event.attempt;
    if (n === undefined || !takesEffect(e)) continue;
    const a = at(n);
    if (e.type === "JobScheduled") a.scheduled ??= e.time;
    if (e.type === "JobStarted") { a.started = e.time; a.resumed = e.event.resumed; }
    if (e.type === "JobPreempted") a.end = [e.time, `preempted (${e.reason ?? e.event.reason})${e.event.killed ? ", killed" : ""}`];
    if (e.type === "JobCompleted") a.end = [e.time, "completed"];
    if (e.type === "JobFailed") a.end = [e.time, `failed (exit ${e.event.exit_code ?? 1})${e.event.reason ? `: ${e.event.reason}` : ""}`];
    // the executor's mean over the attempt's GPU samples (absent: unknown, no NVML there)
    if (["JobPreempted", "JobCompleted", "JobFailed"].includes(e.type)) a.util = e.event.gpu_utilization ?? null;
    if (e.type === "JobCheckpointed") a.checkpoints.push(e);
    if (e.type === "JobProgress" && e.event.step !== undefined) a.step = e.event.step;
  }
  return [...attempts.values()].sort((x, y) => x.n - y.n);
}

function attemptsSection(timeline) {
  const attempts = attemptsOf(timeline);
  if (attempts.length === 0) return null;
  const checkpoints = attempts.flatMap((a) => a.checkpoints);
  return h("section", { class: "card", "aria-labelledby": "attempts-title" },
    h("h2", { id: "attempts-title" }, "Attempts and checkpoints"),
    table("Attempts", [["Attempt", "num"], ["Scheduled", "wide"], "Started", "Ended", ["GPU utilization", "num"], ["Checkpoints", "num"], ["Last step", "num"]],
      attempts.map((a) => h("tr", { "data-attempt": a.n },
        h("td", { class: "num" }, a.n),
        h("td", { class: "wide" }, time(a.scheduled)),
        h("td", {}, a.started ? [time(a.started), a.resumed ? " (resumed)" : ""] : "—"),
        h("td", {}, a.end ? [time(a.end[0]), ` ${a.end[1]}`] : "—"),
        h("td", { class: "num attempt-util" }, a.end ? percent(a.util) : "—"),
        h("td", { class: "num" }, a.checkpoints.length),
        h("td", { class: "num" }, a.step ?? "—"))),
      { class: "attempts" }),
    checkpoints.length ? table("Checkpoints", [["Attempt", "num"], "Saved", ["Step", "num"], ["Size", "num"], ["Took", "num"]],
      checkpoints.slice(-CHECKPOINTS_SHOWN).reverse().map((c) => h("tr", { "data-attempt": c.event.attempt },
        h("td", { class: "num" }, c.event.attempt), h("td", {}, time(c.time)),
        h("td", { class: "num" }, c.event.step ?? "—"),
        h("td", { class: "num" }, bytes(c.event.size_bytes)),
        h("td", { class: "num" }, `${(c.event.save_s ?? 0).toFixed(1)}s`))), { class: "checkpoints" }) : null,
    checkpoints.length > CHECKPOINTS_SHOWN ? h("p", { class: "help" }, `The last ${CHECKPOINTS_SHOWN} of ${checkpoints.length} checkpoints.`) : null);
}

function progressSection(timeline) {
  const reports = timeline.filter((e) => e.type === "JobProgress" && e.event.step !== undefined);
  const messages = timeline.filter((e) => e.type === "JobMessage").slice(-10);
  if (reports.length === 0 && messages.length === 0) return null;
  const last = reports[reports.length - 1];
  return h("section", { class: "card", "aria-labelledby": "progress-title" },
    h("h2", { id: "progress-title" }, "Workload progress"),
    last ? h("p", { class: "summary" }, `Attempt ${last.event.attempt}: step ${last.event.step}`,
      last.event.epoch !== undefined ? `, epoch ${last.event.epoch}` : "",
      Object.entries(last.event.metrics ?? {}).map(([k, v]) => `, ${k} ${Number(v).toPrecision(4)}`),
      " (", time(last.time), ")") : null,
    reports.length > 1 ? sparkline(reports) : null,
    messages.length ? h("ul", { class: "messages" }, messages.map((m) =>
      h("li", {}, time(m.time), ` attempt ${m.event.attempt}: `, m.event.text))) : null);
}

function sparkline(reports) {
  const t0 = reports[0].time;
  const span = Math.max(reports[reports.length - 1].time - t0, 1e-9);
  const top = Math.max(...reports.map((r) => r.event.step), 1);
  const points = reports.map((r) => `${(1000 * (r.time - t0)) / span},${100 - (100 * r.event.step) / top}`);
  return s("svg", { class: "sparkline", viewBox: "0 0 1000 100", preserveAspectRatio: "none", width: "100%", height: 60,
    role: "img", "aria-label": `step over time: ${reports[0].event.step} to ${reports[reports.length - 1].event.step}` },
    s("polyline", { points: points.join(" "), "vector-effect": "non-scaling-stroke" }));
}

function entry(e, open) {
  return h("li", { class: `event${takesEffect(e) ? "" : " no-effect"}`, "data-type": e.type, "data-seq": e.seq,
    "data-reason": e.reason ?? "", "data-for-job": e.for_job ?? "" },
    h("div", { class: "event-head" },
      time(e.time),
      h("strong", { class: "event-type" }, TYPE_NAMES[e.type] ?? e.type),
      takesEffect(e) ? null : h("span", { class: "tag" }, "no effect: the log had moved on")),
    h("p", { class: "event-text" }, describe(e, jobLink)),
    h("details", { open }, h("summary", { id: `facts-${e.seq}` }, "Facts and the whole event"),
      e.event.facts ? factsTable(e.event.facts) : null,
      historyTable(e.event.history ?? e.event.facts?.history),
      h("pre", {}, JSON.stringify(e.event, null, 2))));
}

function factsTable(facts) {
  const projects = [...new Set([...Object.keys(facts.fair_share ?? {}), ...Object.keys(facts.usage ?? {}), ...Object.keys(facts.quota ?? {})])].sort();
  return table(`What the policy saw in pool ${facts.pool}`, ["Project", ["In use", "num"], ["Quota", "num"], ["Fair share", "num"]],
    projects.map((p) => h("tr", {}, h("th", { scope: "row" }, p),
      h("td", { class: "num" }, facts.usage?.[p] ?? 0), h("td", { class: "num" }, facts.quota?.[p] ?? 0),
      h("td", { class: "num" }, facts.fair_share?.[p] ?? 0))));
}

// Rule 11: what the usage history did to the fair shares this decision weighed.
function historyTable(history) {
  if (!history) return null;
  const projects = Object.keys(history.fair_share ?? {}).sort();
  return table(`Usage history (rule 11, half-life ${history.half_life_s} s, k ${history.k})`,
    ["Project", ["Used lately (U)", "num"], ["P", "num"], ["Fair share", "num"], ["Without history", "num"]],
    projects.map((p) => h("tr", {}, h("th", { scope: "row" }, p),
      h("td", { class: "num" }, `${Math.round(100 * (history.decayed_usage?.[p] ?? 0))}%`),
      h("td", { class: "num" }, history.share_weight?.[p] ?? "-"),
      h("td", { class: "num" }, history.fair_share[p]),
      h("td", { class: "num" }, history.without_history?.[p] ?? "-"))));
}

function logsSection(path) {
  const select = h("select", { id: "log-attempt" });
  const output = h("div", { class: "log-output", "aria-live": "polite" });
  const button = h("button", { type: "button", id: "show-logs", onclick: load }, "Show output");
  let known = 0;

  async function load() {
    replace(output, h("p", {}, "Loading…"));
    try {
      const text = await request("GET", `${path}/logs`, { query: { attempt: select.value }, accept: "text/plain" });
      replace(output, text ? h("pre", { class: "log", tabindex: 0 }, text) : h("p", { class: "empty" }, "No output yet."));
    } catch (error) {
      if (error.status === 404 && error.message === "Not Found") {
        replace(output, h("p", { class: "notice", role: "alert" },
          "This API does not serve logs (it answered 404 to the logs route); read them on the node."));
      } else {
        replace(output, problem(error));
      }
    }
  }

  return {
    element: h("section", { class: "card", "aria-labelledby": "logs-title" },
      h("h2", { id: "logs-title" }, "Logs"),
      h("div", { class: "inline-form" }, h("label", { for: "log-attempt" }, "Attempt"), select, button),
      output),
    attempts(count) {
      if (count === known) return;
      known = count;
      select.replaceChildren(...Array.from({ length: count }, (_, i) =>
        h("option", { value: i + 1, selected: i + 1 === count }, `${i + 1}${i + 1 === count ? " (latest)" : ""}`)));
      select.disabled = button.disabled = count === 0;
      if (count === 0) replace(output, h("p", { class: "empty" }, "The job has not started yet: no output."));
    },
  };
}

