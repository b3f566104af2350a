// Submit a job: its name, project (those the token covers), GPUs, replicas, class, command
// (one argument per line, so nothing is split on spaces) and image. The API decides; its
// error is shown beside the form, and on success the job's page opens.

import { get, send } from "../api.js";
import { h, problem, replace } from "../dom.js";

function field(id, label, control, help, whole = false) {
  return h("div", { class: `field${whole ? " whole" : ""}` }, h("label", { for: id }, label), control,
    help ? h("p", { class: "help", id: `${id}-help` }, help) : null);
}

export function mount(main, ctx) {
  const outcome = h("div", { class: "outcome", role: "status", "aria-live": "polite" });
  const project = h("select", { id: "submit-project", name: "project", required: true });
  const inputs = {
    job_id: h("input", { id: "submit-job", name: "job_id", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9_\\-]{0,127}", autocomplete: "off", "aria-describedby": "submit-job-help" }),
    gpus: h("input", { id: "submit-gpus", name: "gpus", type: "number", min: 0, max: 1024, value: 1, required: true }),
    replicas: h("input", { id: "submit-replicas", name: "replicas", type: "number", min: 1, max: 1024, value: 1, required: true }),
    job_class: h("input", { id: "submit-class", name: "class", autocomplete: "off", "aria-describedby": "submit-class-help" }),
    command: h("textarea", { id: "submit-command", name: "command", spellcheck: "false", "aria-describedby": "submit-command-help" }),
    image: h("input", { id: "submit-image", name: "image", autocomplete: "off", "aria-describedby": "submit-image-help" }),
  };
  const button = h("button", { type: "submit", class: "primary", id: "submit-button" }, "Submit");
  const form = h("form", { class: "card form", id: "submit-form", "aria-labelledby": "submit-title", onsubmit: async (e) => {
    e.preventDefault();
    replace(outcome);
    const body = {
      job_id: inputs.job_id.value.trim(),
      project: project.value,
      gpus: Number(inputs.gpus.value),
      replicas: Number(inputs.replicas.value),
      command: inputs.command.value.split("\n").map((line) => line.trim()).filter(Boolean),
    };
    if (inputs.job_class.value.trim()) body.class = inputs.job_class.value.trim();
    if (inputs.image.value.trim()) body.image = inputs.image.value.trim();
    button.disabled = true;
    try {
      await send("POST", "/v1/jobs", body);
      ctx.announce(`Job ${body.job_id} submitted.`);
      window.location.hash = `#/jobs/${encodeURIComponent(body.job_id)}`;
    } catch (error) {
      replace(outcome, problem(error));
      if (error.status === 401) ctx.onUnauthorized();
      (error.field && form.querySelector(`[name="${CSS.escape(error.field)}"]`) || inputs.job_id).focus();
    } finally {
      button.disabled = false;
    }
  } },
    h("h2", { id: "submit-title", class: "whole" }, "A new job"),
    field("submit-job", "Name", inputs.job_id, "Letters, digits, - and _; unique in the cluster."),
    field("submit-project", "Project", project),
    field("submit-gpus", "GPUs per replica", inputs.gpus),
    field("submit-replicas", "Replicas", inputs.replicas),
    field("submit-class", "Class", inputs.job_class, "Optional: a priority class such as train or interactive."),
    field("submit-image", "Image", inputs.image, "Optional: a container image (the docker runtime)."),
    field("submit-command", "Command", inputs.command, "One argument per line, the program first.", true),
    h("div", { class: "buttons" }, button));
  replace(main, h("h1", { tabindex: -1 }, "Submit a job"), outcome, form);
  return {
    title: "Submit a job",
    async refresh() {
      if (project.options.length) return; // the form keeps what was typed on live updates
      try {
        const names = ctx.session.admin ? (await get("/v1/projects")).map((p) => p.name) : ctx.session.projects;
        replace(project, names.map((name) => h("option", { value: name }, name)));
        if (names.length === 0) replace(outcome, h("p", { class: "notice" }, "Your token covers no project: nothing can be submitted."));
      } catch (error) {
        replace(outcome, problem(error));
        if (error.status === 401) throw error;
      }
    },
  };
}
