// The dashboard's shell: sign-in with an API token, the routes, and live updates. Each event
// on the stream schedules a refresh of the page shown, once the read models have caught up
// with it (so the page never shows a state older than the event that prompted it).

import { ApiError, forgetToken, get, saveToken, savedToken } from "./api.js";
import { h, problem, replace } from "./dom.js";
import { follow } from "./stream.js";
import * as overview from "./views/overview.js";
import * as queue from "./views/queue.js";
import * as jobs from "./views/jobs.js";
import * as job from "./views/job.js";
import * as nodes from "./views/nodes.js";
import * as history from "./views/history.js";
import * as submit from "./views/submit.js";
import * as projects from "./views/projects.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const sessionBox = document.getElementById("session");
const liveBox = document.getElementById("live");
const announcer = document.getElementById("announcer");
const REFRESH_DELAY_MS = 300;
const CATCH_UP_MS = 5000;

let session = null;
let stream = null;
let current = null;
let lastSeq = 0;
let timer = null;
let refreshing = false;
let dirty = false;

function announce(text) {
  announcer.textContent = "";
  setTimeout(() => { announcer.textContent = text; }, 50);
}

function route() {
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search ?? "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "jobs" && parts.length > 1) return { view: job, name: "jobs", params: { jobId: parts[1] } };
  if (parts[0] === "jobs") return { view: jobs, name: "jobs", params: Object.fromEntries(params) };
  if (parts[0] === "queue") return { view: queue, name: "queue", params: {} };
  if (parts[0] === "nodes") return { view: nodes, name: "nodes", params: {} };
  if (parts[0] === "submit") return { view: submit, name: "submit", params: {} };
  if (parts[0] === "projects") return { view: projects, name: "projects", params: {} };
  if (parts[0] === "history") return { view: history, name: "history", params: Object.fromEntries(params) };
  return { view: overview, name: "overview", params: {} };
}

function context() {
  const visible = (project) => session.admin || session.projects.includes(project);
  return {
    session,
    visible,
    mayAct: visible,
    announce,
    onUnauthorized: () => signOut("Your token is no longer accepted; sign in again."),
  };
}

async function show() {
  if (!session) return;
  const { view, name, params } = route();
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.route === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  current = view.mount(main, context(), params);
  document.title = `${current.title} · Fairlane`;
  main.querySelector("h1")?.focus();
  await refresh();
}

async function caughtUp(seq) {
  const deadline = Date.now() + CATCH_UP_MS;
  while (Date.now() < deadline) {
    const health = await get("/v1/health");
    if (health.projected_seq >= seq) return;
    await new Promise((done) => setTimeout(done, 150));
  }
}

async function refresh() {
  if (refreshing) {
    dirty = true;
    return;
  }
  refreshing = true;
  const shown = current;
  try {
    await caughtUp(lastSeq);
    if (shown === current) await shown.refresh();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) context().onUnauthorized();
  } finally {
    refreshing = false;
  }
  if (dirty) {
    dirty = false;
    schedule();
  }
}

function schedule() {
  if (timer !== null) return;
  timer = setTimeout(() => {
    timer = null;
    refresh();
  }, REFRESH_DELAY_MS);
}

function startStream() {
  stream = follow({
    onEvent: ({ seq }) => {
      if (seq > lastSeq) lastSeq = seq;
      schedule();
    },
    onState: (state) => {
      if (state === "signed-out") return context().onUnauthorized();
      liveBox.textContent = state === "live" ? "live" : "reconnecting…";
      liveBox.dataset.state = state;
      if (state === "live") schedule(); // whatever happened while the stream was down
    },
  });
}

function signOut(message) {
  forgetToken();
  stream?.stop();
  stream = null;
  session = null;
  current = null;
  nav.hidden = true;
  sessionBox.hidden = true;
  showLogin(message);
}

function showLogin(message) {
  document.title = "Sign in · Fairlane";
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off",
    required: true, spellcheck: "false", "aria-describedby": "token-help" });
  const status = h("div", { id: "login-status" });
  const form = h("form", { class: "login", onsubmit: async (e) => {
    e.preventDefault();
    const token = input.value.trim();
    try {
      const who = await get("/v1/token", undefined, token);
      saveToken(token);
      start(who);
    } catch (error) {
      replace(status, problem(error.status === 401 ? new ApiError(401, "That token is not known to this cluster.") : error));
      input.focus();
    }
  } },
    h("h1", { tabindex: -1 }, "Sign in"),
    message ? h("p", { class: "notice", role: "status" }, message) : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { id: "token-help", class: "help" },
      "The token is kept in this browser tab only (sessionStorage). `fairlane up` writes the admin token to .fairlane/admin-token."),
    h("button", { type: "submit" }, "Sign in"),
    status);
  replace(main, form);
  input.focus();
}

function start(who) {
  session = { name: who.name, admin: who.admin, projects: who.projects };
  const scope = who.admin ? "every project" : `projects: ${who.projects.join(", ") || "none"}`;
  replace(document.getElementById("who"), h("span", {}, `${who.name} · ${scope}`));
  nav.hidden = false;
  sessionBox.hidden = false;
  startStream();
  show();
}

document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
window.addEventListener("hashchange", () => show());

(async () => {
  if (!savedToken()) return showLogin();
  try {
    start(await get("/v1/token"));
  } catch (error) {
    if (error.status === 401) signOut("Your token is no longer accepted; sign in again.");
    else replace(main, problem(error));
  }
})();
