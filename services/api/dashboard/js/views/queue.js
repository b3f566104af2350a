// The queue: every job waiting for GPUs, paused or stopping, with why it waits.

import { allPages, get, mapLimited, scopes } from "../api.js";
import { duration, h, jobLink, problem, replace, stateBadge, table } from "../dom.js";

const WAITING = ["submitted", "pending", "stopping", "paused"];
const SHOWN_MAX = 200;

export function mount(main, ctx) {
  const body = h("div", {});
  replace(main, h("h1", { tabindex: -1 }, "Queue"),
    h("p", { class: "lead" }, "Jobs waiting for GPUs, in submission order, and why each one waits."),
    body);
  return {
    title: "Queue",
    async refresh() {
      try {
        replace(body, await render(ctx));
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
    },
  };
}

async function waitingJobs(ctx) {
  const pages = await Promise.all(scopes(ctx.session).flatMap((project) =>
    WAITING.map((state) => allPages("/v1/jobs", { project, state }, SHOWN_MAX))));
  const jobs = pages.flatMap((p) => p.items).filter((j) => ctx.visible(j.project));
  jobs.sort((a, b) => a.submitted_at - b.submitted_at);
  return { jobs: jobs.slice(0, SHOWN_MAX), more: jobs.length > SHOWN_MAX || pages.some((p) => p.truncated) };
}

async function render(ctx) {
  const { jobs, more } = await waitingJobs(ctx);
  if (jobs.length === 0) return h("p", { class: "empty" }, "Nothing is waiting: every job has its GPUs.");
  const details = await mapLimited(jobs, 6, (j) => get(`/v1/jobs/${encodeURIComponent(j.job_id)}`).catch(() => j));
  return [
    table("Waiting jobs", ["Job", ["Project", "wide"], "State", ["GPUs", "num wide"], ["Waiting", "num"], "Why"],
      details.map((j) => h("tr", { "data-job": j.job_id },
        h("th", { scope: "row" }, jobLink(j.job_id)),
        h("td", { class: "wide" }, j.project),
        h("td", {}, stateBadge(j.state)),
        h("td", { class: "num wide" }, j.gpus * j.min_replicas),
        h("td", { class: "num" }, duration(j.queued_s)),
        h("td", { class: "why" }, j.pending_reason ? j.pending_reason.message : "—"))),
      { class: "queue" }),
    more ? h("p", { class: "help" }, `Only the first ${SHOWN_MAX} are shown.`) : null,
  ];
}
