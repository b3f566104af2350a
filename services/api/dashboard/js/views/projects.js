// Projects: every project's terms and standing per pool (quota, over-quota weight, limit,
// priority, fair share, in use). An admin token gets a form that sets a project's terms in a
// pool (a new project too); what is left blank keeps its value. The API decides.

import { get, send } from "../api.js";
import { h, problem, replace, table } from "../dom.js";

function field(id, label, control, help) {
  return h("div", { class: "field" }, h("label", { for: id }, label), control,
    help ? h("p", { class: "help", id: `${id}-help` }, help) : null);
}

function count(id, name, help) {
  return field(id, name, h("input", { id, type: "number", min: 0, step: 1, "aria-describedby": help ? `${id}-help` : undefined }), help);
}

export function mount(main, ctx) {
  const body = h("div", { "aria-busy": "true" });
  const outcome = h("div", { class: "outcome", role: "status", "aria-live": "polite" });
  const form = ctx.session.admin ? termsForm() : null;
  replace(main, h("h1", { tabindex: -1 }, "Projects"), outcome, form, body);
  const view = {
    title: "Projects",
    async refresh() {
      try {
        const projects = await get("/v1/projects");
        replace(body, projectsTable(projects.filter((p) => ctx.visible(p.name))));
        if (form) {
          const names = form.querySelector("#project-names");
          replace(names, projects.map((p) => h("option", { value: p.name })));
        }
      } catch (error) {
        replace(body, problem(error));
        if (error.status === 401) throw error;
      }
      body.setAttribute("aria-busy", "false");
    },
  };

  function termsForm() {
    const number = (id) => {
      const value = document.getElementById(id).value.trim();
      return value === "" ? undefined : Number(value);
    };
    return h("form", { class: "card form", id: "terms-form", "aria-labelledby": "terms-title", onsubmit: async (e) => {
      e.preventDefault();
      replace(outcome);
      const name = document.getElementById("terms-project").value.trim();
      const terms = {
        pool: document.getElementById("terms-pool").value.trim() || undefined,
        quota: number("terms-quota"),
        over_quota_weight: number("terms-weight"),
        limit: number("terms-limit"),
        no_limit: document.getElementById("terms-no-limit").checked,
        priority: number("terms-priority"),
      };
      try {
        await send("PUT", `/v1/projects/${encodeURIComponent(name)}`, terms);
        replace(outcome, h("p", { class: "ok" }, `Project ${name} set.`));
        ctx.announce(`Project ${name} set.`);
      } catch (error) {
        replace(outcome, problem(error));
        if (error.status === 401) ctx.onUnauthorized();
      }
      await view.refresh();
    } },
      h("h2", { id: "terms-title", class: "whole" }, "Set a project's terms"),
      field("terms-project", "Project", [h("input", { id: "terms-project", required: true, list: "project-names",
        pattern: "[A-Za-z0-9][A-Za-z0-9_\\-]{0,127}", autocomplete: "off", "aria-describedby": "terms-project-help" }),
      h("datalist", { id: "project-names" })], "An existing project, or a new one."),
      field("terms-pool", "Pool", h("input", { id: "terms-pool", autocomplete: "off", "aria-describedby": "terms-pool-help" }),
        "Blank: the cluster's default pool."),
      count("terms-quota", "Quota (GPUs)", "Guaranteed; blank keeps it."),
      count("terms-weight", "Over-quota weight", "Its share of what is spare."),
      count("terms-limit", "Limit (GPUs)", "The most it may hold."),
      h("div", { class: "field" }, h("span", { class: "check" },
        h("input", { id: "terms-no-limit", type: "checkbox" }), h("label", { for: "terms-no-limit" }, "No limit"))),
      field("terms-priority", "Priority", h("input", { id: "terms-priority", type: "number", step: 1 })),
      h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary", id: "terms-button" }, "Set")));
  }

  return view;
}

function projectsTable(projects) {
  const rows = projects.flatMap((p) => p.pools.map((r) => ({ ...r, name: p.name })));
  if (rows.length === 0) return h("p", { class: "empty" }, "No project has terms yet.");
  return table("Projects per pool", ["Project", "Pool", ["Quota", "num"], ["Weight", "num wide"], ["Limit", "num wide"],
    ["Priority", "num wide"], ["Fair share", "num"], ["In use", "num"]],
  rows.map((r) => h("tr", { "data-project": r.name, "data-pool": r.pool },
    h("th", { scope: "row" }, h("a", { href: `#/jobs?project=${encodeURIComponent(r.name)}` }, r.name)),
    h("td", {}, r.pool),
    h("td", { class: "num quota" }, r.quota),
    h("td", { class: "num wide weight" }, r.over_quota_weight),
    h("td", { class: "num wide limit" }, r.limit ?? "none"),
    h("td", { class: "num wide priority" }, r.priority),
    h("td", { class: "num" }, r.fair_share),
    h("td", { class: "num" }, r.usage))), { class: "terms" });
}
