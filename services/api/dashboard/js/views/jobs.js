// Jobs, filtered by project and state (the filters are in the address, so a view can be shared).

import { get, scopes } from "../api.js";
import { duration, h, jobLink, problem, replace, stateBadge, table, time } from "../dom.js";
import { urlLinks } from "./job.js";

const STATES = ["submitted", "pending", "starting", "running", "stopping", "paused",
  "completed", "failed", "cancelled", "rejected"];
const PAGE = 100;

export function mount(main, ctx, params) {
  const project = ctx.session.admin || ctx.session.projects.includes(params.project) ? params.project ?? "" : "";
  const state = STATES.includes(params.state) ? params.state : "";
  const projectSelect = h("select", { id: "filter-project", name: "project" },
    h("option", { value: "" }, ctx.session.admin ? "every project" : "all my projects"));
  const stateSelect = h("select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "any state"),
    STATES.map((name) => h("option", { value: name, selected: name === state }, name)));
  const onChange = () => {
    const query = new URLSearchParams();
    if (projectSelect.value) query.set("project", projectSelect.value);
    if (stateSelect.value) query.set("state", stateSelect.value);
    window.location.hash = `#/jobs${query.size ? `?${query}` : ""}`;
  };
  projectSelect.addEventListener("change", onChange);
  stateSelect.addEventListener("change", onChange);
  const body = h("div", {});
  replace(main, h("h1", { tabindex: -1 }, "Jobs"),
    h("form", { class: "filters", "aria-label": "Filter jobs", onsubmit: (e) => e.preventDefault() },
      h("div", {}, h("label", { for: "filter-project" }, "Project"), projectSelect),
      h("div", {}, h("label", { for: "filter-state" }, "State"), stateSelect)),
    body);
  let shown = PAGE;
  let knownProjects = [];
  return {
    title: "Jobs",
    async refresh() {
      try {
        const names = await visibleProjects(ctx);
        if (names.join() !== knownProjects.join()) {
          knownProjects = names;
          projectSelect.replaceChildren(projectSelect.options[0],
            ...names.map((n) => h("option", { value: n, selected: n === project }, n)));
        }
        const { jobs, more } = await load(ctx, project, state, shown);
        replace(body, render(jobs, more, () => { shown += PAGE; this.refresh(); }));
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
    },
  };
}

async function visibleProjects(ctx) {
  if (!ctx.session.admin) return [...ctx.session.projects].sort();
  return (await get("/v1/projects")).map((p) => p.name);
}

async function load(ctx, project, state, max) {
  const pages = await Promise.all((project ? [project] : scopes(ctx.session)).map((p) =>
    get("/v1/jobs", { project: p, state: state || undefined, limit: Math.min(500, max) })));
  const jobs = pages.flatMap((p) => p.items).filter((j) => ctx.visible(j.project));
  jobs.sort((a, b) => a.submitted_at - b.submitted_at);
  return { jobs: jobs.slice(0, max), more: jobs.length > max || pages.some((p) => p.next !== null) };
}

function render(jobs, more, showMore) {
  if (jobs.length === 0) return h("p", { class: "empty" }, "No job matches.");
  return [
    table(`${jobs.length} job${jobs.length === 1 ? "" : "s"}`,
      ["Job", ["Project", "wide"], "State", ["GPUs held / asked", "num"], ["Attempt", "num wide"], ["Preempted", "num wide"],
        ["Submitted", "wide"], ["Ran", "num wide"], ["URL", "wide"]],
      jobs.map((j) => h("tr", { "data-job": j.job_id },
        h("th", { scope: "row" }, jobLink(j.job_id)),
        h("td", { class: "wide" }, j.project),
        h("td", {}, stateBadge(j.state)),
        h("td", { class: "num" }, `${j.gpus_held}/${j.gpus * j.replicas}`),
        h("td", { class: "num wide" }, j.attempt),
        h("td", { class: "num wide" }, j.preemptions),
        h("td", { class: "wide" }, time(j.submitted_at)),
        h("td", { class: "num wide" }, duration(j.running_s)),
        h("td", { class: "wide url" }, urlLinks(j)))),
      { class: "jobs" }),
    more ? h("button", { type: "button", onclick: showMore }, "Show more") : null,
  ];
}
