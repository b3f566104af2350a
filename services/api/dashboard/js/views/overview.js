// Pools: GPUs in use, releasing and free; each project's usage against quota and fair share.

import { allPages, get } from "../api.js";
import { poolChart, projectChart } from "../chart.js";
import { h, problem, replace, table } from "../dom.js";

export function mount(main, ctx) {
  const body = h("div", { "aria-busy": "true" });
  replace(main, h("h1", { tabindex: -1 }, "Pools"), body);
  return {
    title: "Pools",
    async refresh() {
      try {
        replace(body, await render(ctx));
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
      body.setAttribute("aria-busy", "false");
    },
  };
}

async function render(ctx) {
  const [pools, projects, stopping] = await Promise.all([
    get("/v1/pools"),
    get("/v1/projects"),
    allPages("/v1/jobs", { state: "stopping" }, 2000),
  ]);
  if (pools.length === 0) return h("p", {}, "No pool has a node yet.");
  const releasing = new Map();
  for (const job of stopping.items) {
    releasing.set(job.pool, (releasing.get(job.pool) ?? 0) + job.gpus_held);
  }
  const rows = projects.filter((p) => ctx.visible(p.name)).flatMap((p) => p.pools);
  return pools.map((pool) => poolSection(pool, releasing.get(pool.pool) ?? 0,
    rows.filter((r) => r.pool === pool.pool), ctx));
}

function poolSection(pool, releasing, rows, ctx) {
  const held = Math.min(releasing, pool.allocated);
  const inUse = pool.allocated - held;
  const id = `pool-${pool.pool}`;
  const queued = `${pool.queued_jobs} job${pool.queued_jobs === 1 ? "" : "s"} queued`;
  return h("section", { class: "card", "aria-labelledby": id, "data-pool": pool.pool },
    h("h2", { id }, `Pool ${pool.pool}`),
    h("p", { class: "summary" },
      `${pool.gpus} GPUs on ${pool.nodes} node${pool.nodes === 1 ? "" : "s"}: ${inUse} in use,`
      + ` ${held} releasing, ${pool.free} free; ${queued}.`),
    poolChart({ pool: pool.pool, gpus: pool.gpus, inUse, releasing: held, free: pool.free }),
    h("h3", {}, ctx.session.admin ? "Projects" : "Your projects"),
    rows.length === 0
      ? h("p", {}, "No project of yours has terms or GPUs in this pool.")
      : [projectChart(pool.pool, rows, pool.gpus), projectTable(pool.pool, rows)]);
}

function projectTable(pool, rows) {
  return table(`Projects in pool ${pool}`,
    ["Project", ["In use", "num"], ["Quota", "num"], ["Fair share", "num"], ["Limit", "num wide"], ["Over quota", "wide"],
      ["Used lately (U)", "num wide"]],
    rows.map((r) => h("tr", {},
      h("th", { scope: "row" }, h("a", { href: `#/jobs?project=${encodeURIComponent(r.project)}` }, r.project)),
      h("td", { class: "num" }, r.usage),
      h("td", { class: "num" }, r.quota),
      h("td", { class: "num" }, r.fair_share),
      h("td", { class: "num wide" }, r.limit ?? "none"),
      h("td", { class: "wide" }, r.over_quota ? "yes" : "no"),
      // rule 11: the project's decayed usage, a part of the pool's (none without a half-life)
      h("td", { class: "num wide" }, r.decayed_usage == null ? "-" : `${Math.round(100 * r.decayed_usage)}%`))),
    { class: "projects" });
}
