// Building the page from data without innerHTML: every value becomes text, never markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: h("a", {href: "#"}, "text", otherElement). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** What finds "the same" element again once a region is drawn anew. */
function keyOf(element) {
  if (element.id) return `#${CSS.escape(element.id)}`;
  const href = element.getAttribute("href");
  if (href) return `${element.tagName.toLowerCase()}[href="${CSS.escape(href)}"]`;
  return null;
}

/**
 * Draw a region anew. Live updates redraw regions while someone may be in them with the
 * keyboard: the focused element is found again (by id or link) and keeps the focus.
 */
export function replace(parent, ...children) {
  const focused = parent.contains(document.activeElement) ? keyOf(document.activeElement) : null;
  parent.replaceChildren();
  build(parent, {}, children);
  if (focused) parent.querySelector(focused)?.focus();
}

export function time(epoch) {
  if (epoch === null || epoch === undefined) return "—";
  const at = new Date(epoch * 1000);
  return h("time", { datetime: at.toISOString(), title: at.toLocaleString() },
    at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" }));
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function bytes(count) {
  if (count === null || count === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

export function stateBadge(state) {
  return h("span", { class: `state state-${state}`, "data-state": state }, state);
}

export function jobLink(jobId) {
  return h("a", { href: `#/jobs/${encodeURIComponent(jobId)}` }, jobId);
}

/**
 * A table inside a scrolling region, so a wide table never widens the page on a phone. A header
 * is a name or [name, class]: "num" right-aligns it, "wide" hides it on a phone (its cells too).
 */
export function table(caption, headers, rows, attrs = {}) {
  return h("div", { class: "scroll", role: "region", "aria-label": caption, tabindex: 0 },
    h("table", attrs,
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, headers.map((header) => {
        const [name, cls] = Array.isArray(header) ? header : [header, undefined];
        return h("th", { scope: "col", class: cls }, name);
      }))),
      h("tbody", {}, rows)));
}

/** A message that is an error, shown where the action was. */
export function problem(error) {
  const status = error.status ? ` (${error.status})` : "";
  return h("p", { class: "error", role: "alert" }, `${error.message}${status}`);
}
