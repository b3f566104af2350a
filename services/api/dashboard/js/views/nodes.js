// Nodes: each node's state (ready, cordoned, drained, lost), its GPUs as its executor last
// sampled them through NVML (utilization, memory, temperature, power; "unknown" where NVML
// could not say, never 0), the jobs on each GPU, and the jobs flagged idle (every GPU they
// hold at 0% for the node's idle time). Admins get Cordon, Drain and Uncordon.

import { get, post } from "../api.js";
import { duration, h, jobLink, problem, replace, s, table, time } from "../dom.js";

const UNKNOWN = "unknown";
// Samples change without an event on the log, so this page also reads them on a timer.
const POLL_MS = 3000;
const SERVICE = {
  cordon: { label: "Cordon", done: "cordoned", help: "no new work; what runs there keeps running" },
  drain: { label: "Drain", done: "drained", help: "no new work, and its jobs checkpoint, stop and resume elsewhere" },
  uncordon: { label: "Uncordon", done: "back in service", help: "takes work again" },
};

export function mount(main, ctx) {
  const body = h("div", { "aria-busy": "true" });
  const outcome = h("div", { class: "outcome", role: "status", "aria-live": "polite" });
  replace(main, h("h1", { tabindex: -1 }, "Nodes"), outcome, body);
  const view = {
    title: "Nodes",
    async refresh() {
      try {
        const [report, jobs] = await Promise.all([get("/v1/gpus"), get("/v1/jobs", { limit: 500 })]);
        replace(body, render(report, jobs.items, ctx, act));
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
      body.setAttribute("aria-busy", "false");
    },
  };

  const timer = setInterval(() => {
    if (!main.contains(body)) clearInterval(timer); // another page is shown
    else view.refresh();
  }, POLL_MS);

  async function act(node, verb) {
    replace(outcome);
    try {
      await post(`/v1/nodes/${encodeURIComponent(node)}/${verb}`);
      replace(outcome, h("p", { class: "ok" }, `Node ${node} ${SERVICE[verb].done}.`));
      ctx.announce(`Node ${node} ${SERVICE[verb].done}.`);
    } catch (error) {
      replace(outcome, problem(error));
      if (error.status === 401) ctx.onUnauthorized();
    }
    await view.refresh();
  }

  return view;
}

function render(report, jobs, ctx, act) {
  if (report.nodes.length === 0) return h("p", {}, "No node has registered yet.");
  const idle = report.jobs.filter((j) => j.idle);
  return [
    idleSection(idle),
    report.nodes.map((n) => nodeSection(n, jobs, ctx, act)),
  ];
}

function idleSection(idle) {
  return h("section", { class: "card idle-jobs", "aria-labelledby": "idle-title" },
    h("h2", { id: "idle-title" }, "Idle GPUs"),
    idle.length === 0
      ? h("p", { class: "empty" }, "No job holds GPUs that sat at 0% for its node's idle time.")
      : table("Jobs whose GPUs are all at 0%", ["Job", "Project", ["Nodes", "wide"], ["GPUs", "num"], "Idle since", ["Attempt average", "num wide"]],
        idle.map((j) => h("tr", { "data-job": j.job_id },
          h("td", {}, jobLink(j.job_id), " ", idleBadge()),
          h("td", {}, j.project),
          h("td", { class: "wide" }, j.nodes.join(", ")),
          h("td", { class: "num" }, j.gpus),
          h("td", {}, time(j.idle_since), j.idle_since ? ` (${duration(Date.now() / 1000 - j.idle_since)})` : ""),
          h("td", { class: "num wide" }, percent(j.average)))),
        { class: "idle" }));
}

export function idleBadge() {
  return h("span", { class: "state state-idle", title: "every GPU it holds has been at 0% for the idle time" }, "idle");
}

function nodeState(n) {
  if (n.lost) return "lost";
  return n.cordon || "ready";
}

function nodeSection(n, jobs, ctx, act) {
  const state = nodeState(n);
  const id = `node-${n.node}`;
  const held = n.gpus - n.free;
  const sampled = n.source === "nvml"
    ? ["GPU readings from NVML, sampled every ", `${n.sample_every_s}s`, ", last at ", time(n.sampled_at), "."]
    : [`GPU readings unknown: ${n.error || "no recent sample from its executor"}.`];
  const onNode = jobs.filter((j) => j.nodes.includes(n.node) && j.gpus_held > 0);
  return h("section", { class: "card node", "aria-labelledby": id, "data-node": n.node, "data-state": state },
    h("div", { class: "job-head" },
      h("h2", { id }, `Node ${n.node}`),
      h("span", { class: `state node-state state-${state}`, "data-state": state }, state)),
    h("p", { class: "summary" },
      `Pool ${n.pool}: ${n.gpus} GPU${n.gpus === 1 ? "" : "s"}, ${held} held, ${n.free} free. `, ...sampled),
    ctx.session.admin ? serviceButtons(n, state, act) : null,
    gpuChart(n),
    table(`GPUs of ${n.node}`,
      [["GPU", "num"], ["Model", "wide"], ["Utilization", "num"], ["Memory", "num"], ["Temperature", "num wide"], ["Power", "num wide"], "Job"],
      n.devices.map((d) => h("tr", { "data-gpu": d.index, "data-job": d.job_id ?? "" },
        h("td", { class: "num" }, d.index),
        h("td", { class: "wide" }, d.model || UNKNOWN),
        h("td", { class: "num util" }, percent(d.utilization)),
        h("td", { class: "num" }, memory(d)),
        h("td", { class: "num wide" }, d.temperature_c === null ? UNKNOWN : `${d.temperature_c} °C`),
        h("td", { class: "num wide" }, d.power_w === null ? UNKNOWN : `${d.power_w.toFixed(0)} W`),
        h("td", {}, d.job_id ? [jobLink(d.job_id), d.idle ? [" ", idleBadge()] : null]
          : d.held ? `a job of ${d.project}` : "free"))),
      { class: "gpus" }),
    onNode.length ? h("p", { class: "help" }, "Jobs here: ", onNode.flatMap((j, i) =>
      [i ? ", " : "", jobLink(j.job_id), ` (${j.gpus_held} GPU${j.gpus_held === 1 ? "" : "s"})`])) : null);
}

function serviceButtons(n, state, act) {
  const allowed = {
    cordon: state === "ready",
    drain: state === "ready" || state === "cordoned",
    uncordon: state === "cordoned" || state === "drained",
  };
  return h("div", { class: "actions", role: "group", "aria-label": `Service of node ${n.node}` },
    Object.entries(SERVICE).map(([verb, what]) => h("button", {
      type: "button", id: `${verb}-${n.node}`, class: verb === "drain" ? "danger" : "",
      disabled: n.lost || !allowed[verb], title: what.help, onclick: () => act(n.node, verb),
    }, what.label)));
}

export function percent(value) {
  return value === null || value === undefined ? UNKNOWN : `${Math.round(value)}%`;
}

function memory(d) {
  if (d.memory_used_mb === null || d.memory_total_mb === null) return UNKNOWN;
  return `${(d.memory_used_mb / 1024).toFixed(1)} / ${(d.memory_total_mb / 1024).toFixed(0)} GiB`;
}

// One bar per GPU: its utilization as the bar's height, memory in use as a second, thinner
// bar; an unknown reading is drawn as a full grey bar and labelled, never as an empty (0%) one.
function gpuChart(n) {
  const hatch = `unknown-${n.node.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  const count = Math.max(n.devices.length, 1);
  const width = 100 / count;
  const words = n.devices.map((d) => `GPU ${d.index}: utilization ${percent(d.utilization)}, memory ${memory(d)}`).join("; ");
  const bars = n.devices.map((d, i) => {
    const x = i * width;
    const util = d.utilization;
    const mem = d.memory_used_mb !== null && d.memory_total_mb ? (100 * d.memory_used_mb) / d.memory_total_mb : null;
    return s("g", { class: `gpu-bar${d.idle ? " idle" : ""}`, "data-gpu": d.index, "data-utilization": util ?? UNKNOWN },
      s("rect", { class: "track", x: `${x + width * 0.1}%`, y: 0, width: `${width * 0.55}%`, height: 100 }),
      util === null
        ? s("rect", { class: "unknown", fill: `url(#${hatch})`, x: `${x + width * 0.1}%`, y: 0, width: `${width * 0.55}%`, height: 100 })
        : s("rect", { class: "util", x: `${x + width * 0.1}%`, y: 100 - util, width: `${width * 0.55}%`, height: util }),
      mem === null
        ? s("rect", { class: "unknown", fill: `url(#${hatch})`, x: `${x + width * 0.7}%`, y: 0, width: `${width * 0.15}%`, height: 100 })
        : s("rect", { class: "mem", x: `${x + width * 0.7}%`, y: 100 - mem, width: `${width * 0.15}%`, height: mem }));
  });
  return h("figure", { class: "chart gpu-chart", "data-node": n.node },
    s("svg", { role: "img", "aria-label": `node ${n.node}: ${words}`, width: "100%", height: 100,
      viewBox: "0 0 100 100", preserveAspectRatio: "none", class: "gpus" },
      s("defs", {}, s("pattern", { id: hatch, width: 4, height: 4, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { class: "hatch-ground", x: 0, y: 0, width: 4, height: 4 }),
        s("rect", { class: "hatch-line", x: 0, y: 0, width: 1.2, height: 4 }))),
      bars),
    h("ol", { class: "gpu-labels", "aria-hidden": "true" },
      n.devices.map((d) => h("li", {}, `GPU ${d.index}`, h("br", {}), percent(d.utilization), d.idle ? [" ", idleBadge()] : null))),
    h("figcaption", {}, h("ul", { class: "legend" },
      h("li", {}, h("span", { class: "swatch util", "aria-hidden": "true" }), "utilization"),
      h("li", {}, h("span", { class: "swatch mem", "aria-hidden": "true" }), "memory in use"),
      h("li", {}, h("span", { class: "swatch unknown", "aria-hidden": "true" }), "unknown"))));
}
