// Hand-made SVG bar charts. Positions are percentages of the chart's width, so a chart fills a
// phone's screen or a laptop's without stretching its text; each chart says its numbers in
// words as well (aria-label), for those who do not see it.

import { h, s } from "./dom.js";

const pct = (part, whole) => `${whole > 0 ? (100 * part) / whole : 0}%`;

function legend(items) {
  return h("ul", { class: "legend" },
    items.map(([cls, name]) => h("li", {}, h("span", { class: `swatch ${cls}`, "aria-hidden": "true" }), name)));
}

/** One pool's GPUs: in use, releasing (held by stopping jobs), free. */
export function poolChart({ pool, gpus, inUse, releasing, free }) {
  const parts = [["in-use", inUse], ["releasing", releasing], ["free", free]];
  let x = 0;
  const rects = parts.map(([cls, n]) => {
    const rect = s("rect", { class: cls, x: pct(x, gpus), y: 0, width: pct(n, gpus), height: 28 });
    x += n;
    return rect;
  });
  const label = `pool ${pool}: ${gpus} GPUs, ${inUse} in use, ${releasing} releasing, ${free} free`;
  return h("figure", { class: "chart pool-chart", "data-pool": pool, "data-in-use": inUse,
    "data-releasing": releasing, "data-free": free, "data-gpus": gpus },
    s("svg", { role: "img", "aria-label": label, width: "100%", height: 28, class: "bar" }, rects),
    h("figcaption", {}, legend([["in-use", `${inUse} in use`], ["releasing", `${releasing} releasing`],
      ["free", `${free} free`]])));
}

/** Each project's GPUs in use in one pool, against its quota and its fair share. */
export function projectChart(pool, rows, poolGpus) {
  const scale = Math.max(poolGpus, ...rows.flatMap((r) => [r.usage, r.quota, r.fair_share]), 1);
  const bars = rows.map((r) => {
    const within = Math.min(r.usage, r.quota);
    const over = r.usage - within;
    const words = `${r.project}: ${r.usage} GPUs in use against a quota of ${r.quota}` +
      ` and a fair share of ${r.fair_share}${over > 0 ? `, ${over} over quota` : ""}`;
    return h("li", { class: "project-bar", "data-project": r.project, "data-usage": r.usage,
      "data-quota": r.quota, "data-fair-share": r.fair_share },
      h("span", { class: "bar-name" }, r.project),
      h("span", { class: "bar-value" }, `${r.usage}/${r.quota}`),
      // the fair share's mark reaches past the bar, so it shows where it meets the quota's
      s("svg", { role: "img", "aria-label": words, width: "100%", height: 32, class: "bar" },
        s("rect", { class: "track", x: 0, y: 4, width: "100%", height: 24 }),
        s("rect", { class: "in-quota", x: 0, y: 4, width: pct(within, scale), height: 24 }),
        s("rect", { class: "over-quota", x: pct(within, scale), y: 4, width: pct(over, scale), height: 24 }),
        s("line", { class: "share-mark", x1: pct(r.fair_share, scale), x2: pct(r.fair_share, scale), y1: 0, y2: 32 }),
        s("line", { class: "quota-mark", x1: pct(r.quota, scale), x2: pct(r.quota, scale), y1: 4, y2: 28 })));
  });
  return h("figure", { class: "chart project-chart", "data-pool": pool },
    h("ul", { class: "bars" }, bars),
    h("figcaption", {}, legend([["in-quota", "in use within quota"], ["over-quota", "in use over quota"],
      ["quota-mark", "quota"], ["share-mark", "fair share"]]),
      h("p", { class: "scale" }, `scale: 0 to ${scale} GPUs`)));
}
