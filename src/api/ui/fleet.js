// The fleet at a glance: counts (sites down among them, since operators think in
// buildings), the last hour's rates (kept by latch itself, summed over the cluster's
// nodes, so the charts are full when the page opens), the live events of the whole fleet,
// the sites down and the lost sensors.

import { api, q, enc, h, say, when, table, onLive, feedItem, debounce, chart, recent } from "/ui/lib.js";

/** The rate panels: a key of `GET /v1/fleet/rates`, and what it counts. */
const PANELS = [
  ["readings", "Readings accepted"],
  ["changes", "State changes"],
  ["delivered", "Webhooks delivered"],
  ["failed", "Webhooks failed"],
  ["lost", "Sensors lost"],
  ["restored", "Sensors restored"],
];
/** The rates are read again this often (a bucket is 10 s). */
const REFRESH_MS = 10e3;

/** Sites down listed on the page (the sites page has them all). */
const SITES_SHOWN = 10;

/** The buckets of the last minute (the bucket in progress is not in the answer). */
const MINUTE_S = 60;

/** One panel: the rate over the last minute (the big number, which its label names), the
 * hour's total, and the hour as a chart of per-second rates. */
function panel(r, key, name) {
  const counts = r[key];
  const s = r.bucket_s;
  const to = Date.parse(r.to);
  const points = counts.map((n, i) => ({ t: to - (counts.length - i - 1) * s * 1000, v: n / s }));
  const buckets = Math.max(1, Math.round(MINUTE_S / s));
  const minute = counts.slice(-buckets).reduce((a, b) => a + b, 0) / (buckets * s);
  const hour = counts.reduce((a, b) => a + b, 0);
  return h("section", { class: "card", "aria-label": name },
    h("div", { class: "k" }, name),
    h("div", { class: "n" }, `${minute.toFixed(minute < 10 ? 2 : 1)}/s`),
    h("div", { class: "k rate" }, "over the last minute"),
    h("div", { class: "k total" }, `${hour} in the last hour`),
    chart(points, to - counts.length * s * 1000, to, `${name} per second, the last hour`));
}

export async function fleetPage() {
  const cards = h("div", { class: "cards" });
  const historyFrom = h("p", { class: "muted", "aria-label": "History kept from" });
  const feed = h("ul", { class: "feed", "aria-label": "Live events" });
  const sitesDown = h("div");
  const draw = async () => {
    const [f, down] = await Promise.all([api("GET", "/v1/fleet"), api("GET", `/v1/sites${q({ state: "down", limit: SITES_SHOWN })}`)]);
    const card = (cls, n, k, href) => h("a", { class: `card ${cls}`, href, "aria-label": `${n} ${k}` },
      h("div", { class: "n" }, n), h("div", { class: "k" }, k));
    cards.replaceChildren(
      card("online", f.online, "online", "#/sensors?connection=online"),
      card("lost", f.lost, "lost", "#/sensors?connection=lost"),
      card(f.sites_down ? "lost" : "", f.sites_down, f.sites_down === 1 ? "site down" : "sites down", "#/sites"),
      card("unknown", f.unknown, "never reported", "#/sensors?connection=unknown"),
      // Door alarms open now (issue #72), each a filter of the sensors' list.
      card(f.held ? "lost" : "", f.held, "held open too long", "#/sensors?alarm=held"),
      card(f.battery_low ? "lost" : "", f.battery_low, f.battery_low === 1 ? "battery low" : "batteries low", "#/sensors?alarm=battery_low"),
      card(f.flapping ? "lost" : "", f.flapping, "flapping", "#/sensors?alarm=flapping"),
      card("", f.sensors, "sensors registered", "#/sensors"),
      card("", f.notifications_pending, "notifications pending", "#/notifications?status=pending"),
    );
    historyFrom.textContent = f.history_from ? `History kept from ${when(f.history_from)}.` : "No history kept yet.";
    sitesDown.replaceChildren(table(["Site down", "Since", "Lost"], down.items.map((x) => h("tr", {},
      h("td", {}, h("a", { href: `#/sites/${enc(x.id)}` }, x.id), x.name ? h("span", { class: "muted" }, ` ${x.name}`) : ""),
      h("td", {}, when(x.status.since)),
      h("td", { class: "num" }, h("a", { href: `#/sensors${q({ site_id: x.id, connection: "lost" })}` }, `${x.status.lost} of ${x.status.sensors}`)))),
      "No site is down."),
    down.next_cursor ? h("p", {}, h("a", { href: "#/sites" }, `All ${f.sites_down} sites down`)) : "");
  };
  await draw();
  const lost = await api("GET", `/v1/sensors${q({ connection: "lost", limit: 10 })}`);
  const lostList = table(["Lost sensor", "Address", "Last seen"], lost.items.map((s) => h("tr", {},
    h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)), h("td", {}, s.address),
    h("td", {}, when(s.status.last_seen_at)))), "No sensor is lost.");
  const rateBox = h("div", { class: "rates" });
  const source = h("p", { class: "muted" });
  const drawRates = async () => {
    const r = await api("GET", "/v1/fleet/rates");
    rateBox.replaceChildren(...PANELS.map(([key, name]) => panel(r, key, name)));
    source.textContent = `10-second buckets to ${when(r.to)}, summed over ${r.nodes} node(s)` +
      (r.missing.length ? `; not answering: ${r.missing.join(", ")}` : "") + ".";
  };
  await drawRates();
  const timer = setInterval(() => {
    if (!document.body.contains(rateBox)) clearInterval(timer);
    else drawRates().catch((e) => say(e.message));
  }, REFRESH_MS);
  feed.replaceChildren(...(recent.length ? recent.map((e) => feedItem(e)) : [h("li", { class: "muted" }, "No events since this page opened.")]));
  const redraw = debounce(() => draw().catch((e) => say(e.message)), 300);
  onLive((e) => {
    if (e) {
      if (feed.firstChild?.classList.contains("muted")) feed.replaceChildren();
      feed.prepend(feedItem(e, true));
    }
    redraw();
  });
  return [h("h1", {}, "Fleet"), cards, historyFrom, h("h2", {}, "Rates"), rateBox, source,
    h("div", { class: "cols" },
      h("section", {}, h("h2", {}, "Live events"), feed),
      h("section", {}, h("section", { "aria-label": "Sites down" }, h("h2", {}, "Sites down"), sitesDown),
        h("h2", {}, "Lost sensors"), lostList,
        lost.next_cursor ? h("p", {}, h("a", { href: "#/sensors?connection=lost" }, "All lost sensors")) : ""))];
}
