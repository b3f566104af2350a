// Projects: every project's terms and standing per pool (quota, over-quota weight, limit,
// priority, fair share, in use). An admin token gets a form that sets a project's terms in a
// pool (a new project too; what is left blank keeps its value), and one that sets a pool's own
// scheduler settings, time-aware fairness (rule 11) among them. The API decides.

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
  const poolForm = ctx.session.admin ? schedulerForm() : null;
  replace(main, h("h1", { tabindex: -1 }, "Projects"), outcome, form, poolForm, body);
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

  function schedulerForm() {
    const value = (id) => document.getElementById(id).value.trim();
    return h("form", { class: "card form", id: "pool-form", "aria-labelledby": "pool-title", onsubmit: async (e) => {
      e.preventDefault();
      replace(outcome);
      const name = value("pool-name");
      const hours = value("pool-half-life");
      const k = value("pool-k");
      const settings = {
        scheduler: value("pool-scheduler") || undefined,
        fitting: value("pool-fitting"),
        victim_order: value("pool-victim-order"),
        usage_half_life_s: hours === "" ? undefined : Number(hours) * 3600,
        usage_k: k === "" ? undefined : Number(k),
      };
      try {
        await send("PUT", `/v1/pools/${encodeURIComponent(name)}`, settings);
        replace(outcome, h("p", { class: "ok" }, `Pool ${name} set.`));
        ctx.announce(`Pool ${name} set.`);
      } catch (error) {
        replace(outcome, problem(error));
        if (error.status === 401) ctx.onUnauthorized();
      }
      await view.refresh();
    } },
      h("h2", { id: "pool-title", class: "whole" }, "Set a pool's scheduler"),
      field("pool-name", "Pool", h("input", { id: "pool-name", required: true, autocomplete: "off",
        pattern: "[A-Za-z0-9][A-Za-z0-9_\\-]{0,127}", "aria-describedby": "pool-name-help" }),
      "An existing pool, or a new one."),
      field("pool-scheduler", "Scheduler", h("select", { id: "pool-scheduler", "aria-describedby": "pool-scheduler-help" },
        h("option", { value: "" }, "the cluster's"), h("option", { value: "fair_share" }, "fair_share"),
        h("option", { value: "priority" }, "priority"), h("option", { value: "round_robin" }, "round_robin")),
      "Its own settings replace the cluster's as a whole."),
      field("pool-fitting", "Fitting", h("select", { id: "pool-fitting" },
        h("option", { value: "best" }, "best (packs)"), h("option", { value: "worst" }, "worst (spreads)"))),
      field("pool-victim-order", "Victims", h("select", { id: "pool-victim-order" },
        h("option", { value: "newest" }, "newest first"), h("option", { value: "cost" }, "least work lost"))),
      field("pool-half-life", "Usage half-life (hours)", h("input", { id: "pool-half-life", type: "number", min: 0,
        step: "any", "aria-describedby": "pool-half-life-help" }),
      "Time-aware fairness: past use lowers a project's share above quota. Blank: off."),
      field("pool-k", "k", h("input", { id: "pool-k", type: "number", min: 0, step: "any", placeholder: "1",
        "aria-describedby": "pool-k-help" }), "How much past use weighs (0: not at all)."),
      h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary", id: "pool-button" }, "Set")));
  }

  return view;
}

function projectsTable(projects) {
  const rows = projects.flatMap((p) => p.pools.map((r) => ({ ...r, name: p.name })));
  if (rows.length === 0) return h("p", { class: "empty" }, "No project has terms yet.");
  return table("Projects per pool", ["Project", "Pool", ["Quota", "num"], ["Weight", "num wide"], ["Limit", "num wide"],
    ["Priority", "num wide"], ["Fair share", "num"], ["In use", "num"], ["Used lately (U)", "num wide"]],
  rows.map((r) => h("tr", { "data-project": r.name, "data-pool": r.pool },
    h("th", { scope: "row" }, h("a", { href: `#/jobs?project=${encodeURIComponent(r.name)}` }, r.name)),
    h("td", {}, r.pool),
    h("td", { class: "num quota" }, r.quota),
    h("td", { class: "num wide weight" }, r.over_quota_weight),
    h("td", { class: "num wide limit" }, r.limit ?? "none"),
    h("td", { class: "num wide priority" }, r.priority),
    h("td", { class: "num" }, r.fair_share),
    h("td", { class: "num" }, r.usage),
    h("td", { class: "num wide used" }, r.decayed_usage == null ? "-" : `${Math.round(100 * r.decayed_usage)}%`))),
  { class: "terms" });
}
