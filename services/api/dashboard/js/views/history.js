// History: each project's GPUs in use against its quota and fair share over time, and each
// pool's GPUs allocated, from the API's `/v1/history` (made again from the timeline). Lines
// are SVG drawn here; each chart is described in words and its points are given as a table.

import { get } from "../api.js";
import { h, problem, replace, s, table, time } from "../dom.js";

const WINDOWS = [
  ["900", "the last 15 minutes"],
  ["3600", "the last hour"],
  ["21600", "the last 6 hours"],
  ["86400", "the last day"],
  ["all", "since the first event"],
];
const POINTS = 60;
const W = 1000;
const H = 200;

export function mount(main, ctx, params) {
  const body = h("div", { "aria-busy": "true" });
  const select = h("select", { id: "history-window" },
    WINDOWS.map(([value, label]) => h("option", { value, selected: value === (params.window ?? "all") }, label)));
  select.addEventListener("change", () => {
    window.location.hash = `#/history?window=${select.value}`;
  });
  replace(main, h("h1", { tabindex: -1 }, "History"),
    h("div", { class: "filters" }, h("div", {}, h("label", { for: "history-window" }, "Show"), select)),
    body);
  return {
    title: "History",
    async refresh() {
      try {
        const span = select.value === "all" ? undefined : Number(select.value);
        const until = Date.now() / 1000;
        const found = await get("/v1/history", { points: POINTS, since: span ? until - span : undefined, until });
        replace(body, render(found, ctx));
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
      body.setAttribute("aria-busy", "false");
    },
  };
}

// Points as rows: [time, GPUs, allocated] for a pool, [time, in use, quota, fair share] for a
// project (the API sends them as objects).
function rows(found) {
  return {
    ...found,
    pools: found.pools.map((p) => ({ ...p, points: p.points.map((x) => [x.time, x.gpus, x.allocated]) })),
    projects: found.projects.map((p) => ({ ...p, points: p.points.map((x) => [x.time, x.usage, x.quota, x.fair_share]) })),
  };
}

function render(given, ctx) {
  const found = rows(given);
  if (found.pools.length === 0) return h("p", { class: "empty" }, "Nothing has happened yet in this window.");
  return found.pools.map((pool) => {
    const rows = found.projects.filter((p) => p.pool === pool.pool && ctx.visible(p.project));
    const top = Math.max(1, ...pool.points.map(([, gpus]) => gpus),
      ...rows.flatMap((r) => r.points.flatMap(([, u, q, f]) => [u, q, f])));
    const id = `history-${pool.pool}`;
    return h("section", { class: "card history", "aria-labelledby": id, "data-pool": pool.pool },
      h("h2", { id }, `Pool ${pool.pool}`),
      h("p", { class: "summary" }, "From ", time(found.since), " to ", time(found.until), `, a point every ${Math.round(found.step_s)} s.`),
      h("h3", {}, "GPUs allocated"),
      poolChart(pool, found),
      h("h3", {}, ctx.session.admin ? "Projects" : "Your projects"),
      rows.length === 0 ? h("p", { class: "empty" }, "No project of yours had terms or GPUs here.")
        : rows.map((r) => projectChart(r, top, found)));
  });
}

const x = (t, found) => (found.until > found.since ? (W * (t - found.since)) / (found.until - found.since) : W);
// a margin above and below, so a line at the top or at 0 is not cut in half by the frame
const PAD = 8;
const y = (v, top) => H - PAD - ((H - 2 * PAD) * v) / top;

// Steps, not slopes: a value holds from one point until the next (it changes at events).
function line(points, cls, found, top, at) {
  const d = points.map((p, i) => {
    const px = x(p[0], found).toFixed(1);
    const py = y(p[at], top).toFixed(1);
    return i ? `H${px} V${py}` : `M${px},${py}`;
  }).join(" ");
  return s("path", { class: cls, d, "vector-effect": "non-scaling-stroke" });
}

function frame(label, top, found, ...children) {
  return h("div", { class: "line-chart" },
    h("div", { class: "y-scale", "aria-hidden": "true" }, h("span", {}, top), h("span", {}, 0)),
    s("svg", { role: "img", "aria-label": label, viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", width: "100%", height: 160 },
      s("rect", { class: "track", x: 0, y: 0, width: W, height: H }), ...children),
    h("div", { class: "x-scale", "aria-hidden": "true" }, time(found.since), time(found.until)));
}

function poolChart(pool, found) {
  const top = Math.max(1, ...pool.points.map(([, gpus]) => gpus));
  const last = pool.points[pool.points.length - 1];
  const peak = Math.max(...pool.points.map(([, , a]) => a));
  const label = `pool ${pool.pool}: ${last[2]} of ${last[1]} GPUs allocated now, at most ${peak} in this window`;
  const start = x(pool.points[0][0], found).toFixed(1);
  const area = `${line(pool.points, "", found, top, 2).getAttribute("d")} V${H - PAD} H${start} Z`;
  return h("figure", { class: "chart pool-history", "data-pool": pool.pool, "data-peak": peak },
    frame(label, top, found,
      s("path", { class: "allocated-area", d: area }),
      line(pool.points, "gpus-line", found, top, 1),
      line(pool.points, "allocated-line", found, top, 2)),
    h("figcaption", {}, legend([["allocated", "GPUs allocated"], ["gpus", "GPUs in the pool"]])),
    points(`Pool ${pool.pool} over time`, ["GPUs", "Allocated"], pool.points));
}

function projectChart(r, top, found) {
  const last = r.points[r.points.length - 1];
  const peak = Math.max(...r.points.map(([, u]) => u));
  const over = r.points.filter(([, u, q]) => u > q).length;
  const label = `${r.project}: ${last[1]} GPUs in use now against a quota of ${last[2]} and a fair share of ${last[3]};`
    + ` at most ${peak} in use; over quota at ${over} of ${r.points.length} points`;
  return h("figure", { class: "chart project-history", "data-project": r.project, "data-peak": peak, "data-over": over },
    h("p", { class: "bar-name" }, r.project),
    frame(label, top, found,
      line(r.points, "quota-line", found, top, 2),
      line(r.points, "share-line", found, top, 3),
      line(r.points, "usage-line", found, top, 1)),
    h("figcaption", {}, legend([["usage", "in use"], ["quota", "quota"], ["share", "fair share"]])),
    points(`${r.project} over time`, ["In use", "Quota", "Fair share"], r.points));
}

function legend(items) {
  return h("ul", { class: "legend" },
    items.map(([cls, name]) => h("li", {}, h("span", { class: `swatch line-${cls}`, "aria-hidden": "true" }), name)));
}

function points(caption, names, rows) {
  return h("details", {}, h("summary", {}, "The points as a table"),
    table(caption, ["Time", ...names.map((n) => [n, "num"])],
      rows.map(([t, ...values]) => h("tr", {}, h("td", {}, time(t)), values.map((v) => h("td", { class: "num" }, v))))));
}
