// Talking to the API: every request carries the token from sessionStorage as a bearer header
// (never in a URL); errors come back as ApiError with the API's own message.

const KEY = "fairlane.token";

export function savedToken() {
  return sessionStorage.getItem(KEY);
}

export function saveToken(token) {
  sessionStorage.setItem(KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message, field) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

export function authHeaders(token = savedToken()) {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function errorFrom(response) {
  let message = response.statusText || `HTTP ${response.status}`;
  let field = null;
  try {
    const body = await response.json();
    message = body.error ?? body.detail ?? message;
    field = body.field ?? null;
  } catch {
    // not JSON: keep the status text
  }
  return new ApiError(response.status, message, field);
}

export async function request(method, path, { token, query, accept = "application/json", body } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  let response;
  try {
    const headers = { Accept: accept, ...authHeaders(token) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, `the API cannot be reached (${e.message})`, null);
  }
  if (!response.ok) throw await errorFrom(response);
  return accept === "application/json" ? response.json() : response.text();
}

export const get = (path, query, token) => request("GET", path, { query, token });
export const post = (path) => request("POST", path);
export const del = (path) => request("DELETE", path);
/** A request with a JSON body (a form's values). */
export const send = (method, path, body) => request(method, path, { body });

/** Every page of a paged listing (`items`, `next`), up to `max` items. */
export async function allPages(path, query, max) {
  const items = [];
  let after;
  do {
    const page = await get(path, { ...query, after, limit: Math.min(500, max - items.length) });
    items.push(...page.items);
    after = page.next ?? undefined;
  } while (after !== undefined && items.length < max);
  return { items, truncated: after !== undefined };
}

/** Run `work` over `items` with at most `width` in flight. */
export async function mapLimited(items, width, work) {
  const results = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const at = next++;
      results[at] = await work(items[at]);
    }
  }
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  return results;
}

/** The most projects asked for one by one; a token with more gets the listing unfiltered and
 * keeps its own projects' rows (the API lets any token read). */
const PER_PROJECT_MAX = 10;

/** The `project` filters that list what a session may see: undefined means every project. */
export function scopes(session) {
  if (session.admin || session.projects.length > PER_PROJECT_MAX) return [undefined];
  return session.projects;
}
