// Silences (maintenance windows): the list by state, made from here or from a site's or a
// sensor's page (silenceForm), extended (PATCH of its end) and ended (DELETE) in one click.

import { PAGE, api, q, enc, h, say, when, badge, table, field, form, actionButton, pager, navigate, clientNames, eventTypes } from "/ui/lib.js";

/** How long a silence made here lasts, or how much longer an extension makes it. */
const SPANS = { "30m": 30 * 60e3, "1h": 3600e3, "2h": 2 * 3600e3, "4h": 4 * 3600e3, "8h": 8 * 3600e3, "24h": 86400e3 };
const SPAN_NAMES = { "30m": "30 minutes", "1h": "1 hour", "2h": "2 hours", "4h": "4 hours", "8h": "8 hours", "24h": "24 hours" };
const STATES = ["active", "pending", "ended", ""];

const spanPick = (name, value = "1h") => h("select", { name },
  Object.keys(SPANS).map((k) => h("option", { value: k, selected: k === value }, SPAN_NAMES[k])));

/** What a silence matches, in words and links. */
function matchOf(m, names) {
  const parts = [];
  if (m.site_id) parts.push(h("span", {}, "site ", h("a", { href: `#/sites/${enc(m.site_id)}` }, m.site_id)));
  if (m.sensor_ids) {
    const shown = m.sensor_ids.slice(0, 5);
    parts.push(h("span", {}, m.sensor_ids.length === 1 ? "sensor " : "sensors ",
      shown.flatMap((id, i) => [i ? ", " : "", h("a", { href: `#/sensors/${enc(id)}` }, id)]),
      m.sensor_ids.length > shown.length ? ` and ${m.sensor_ids.length - shown.length} more` : ""));
  }
  if (m.client_id) parts.push(h("span", {}, "client ", names ? names.link(m.client_id) : m.client_id));
  if (m.types) parts.push(h("span", {}, m.types.join(", ")));
  return parts.flatMap((p, i) => [i ? "; " : "", p]);
}

/** A table of silences, each not ended with its Extend and End controls; `changed` runs
 * after one of them changed a silence. */
export function silenceTable(items, names, changed, empty = "No silences.") {
  return table(["Comment", "Matches", "State", "Starts", "Ends", ""], items.map((s) => h("tr", {},
    h("td", {}, s.comment),
    h("td", {}, matchOf(s.match, names)),
    h("td", {}, badge(s.state)),
    h("td", {}, when(s.starts_at)),
    h("td", {}, when(s.ends_at)),
    h("td", {}, s.state === "ended" ? (s.reconciled_at ? h("span", { class: "muted" }, `clients brought up to date ${when(s.reconciled_at)}`) : "")
      : h("div", { class: "toolbar" },
        form([field(`Extend "${s.comment}" by`, spanPick("by", "1h"))], async (d) => {
          const ends_at = new Date(Date.parse(s.ends_at) + SPANS[d.get("by")]).toISOString();
          await api("PATCH", `/v1/silences/${enc(s.id)}`, { ends_at });
          say(`Silence "${s.comment}" extended to ${when(ends_at)}.`, true);
          await changed();
        }, "Extend"),
        actionButton(`End "${s.comment}" now`, async () => {
          await api("DELETE", `/v1/silences/${enc(s.id)}`);
          say(`Silence "${s.comment}" ended.`, true);
          await changed();
        }, "danger"))))), empty);
}

/** A form that makes a silence of `match` (its site, its sensor) from now for a chosen
 * time, with a comment saying why. */
export function silenceForm(match, label, made) {
  return form([
    field("For", spanPick("span", "1h")),
    field("Comment (who is doing what)", h("input", { name: "comment", required: true, maxlength: 1000, size: 40 })),
  ], async (d) => {
    const ends_at = new Date(Date.now() + SPANS[d.get("span")]).toISOString();
    const s = await api("POST", "/v1/silences", { match, ends_at, comment: d.get("comment") });
    say(`Silence "${s.comment}" made, until ${when(s.ends_at)}.`, true);
    await made(s);
  }, label);
}

/** The silences not ended (active, then pending) whose match passes `test`. */
export async function silencesOf(test) {
  const [active, pending] = await Promise.all(["active", "pending"].map((state) =>
    api("GET", `/v1/silences${q({ state, limit: 1000 })}`)));
  return [...active.items, ...pending.items].filter((s) => test(s.match));
}

export async function silencesPage(params) {
  const state = STATES.includes(params.get("state") ?? "active") ? (params.get("state") ?? "active") : "active";
  const names = await clientNames();
  const types = (await eventTypes()).map((t) => t.type);
  const list = pager(
    (cursor) => api("GET", `/v1/silences${q({ state, limit: PAGE, cursor })}`),
    (items) => silenceTable(items, names, () => list.go(), state ? `No ${state} silences.` : "No silences."));
  await list.go();
  const pick = h("select", { name: "state" }, STATES.map((s) => h("option", { value: s, selected: s === state }, s || "any")));
  const filter = form([field("State", pick)], async (d) => navigate(`#/silences${q({ state: d.get("state") })}`), "Show");
  pick.addEventListener("change", () => filter.requestSubmit());
  const clientPick = h("select", { name: "client_id" }, h("option", { value: "" }, "any client"),
    [...names.all()].map(([id, name]) => h("option", { value: id }, name)));
  const create = form([
    field("Site id", h("input", { name: "site_id", maxlength: 64, size: 16 })),
    field("Sensor ids (comma or space between)", h("input", { name: "sensor_ids", size: 30 })),
    field("Client", clientPick),
    field("Types (none: every type)", h("select", { name: "types", multiple: true, size: 3 }, types.map((t) => h("option", { value: t }, t)))),
    field("Starts (empty: now)", h("input", { name: "starts_at", type: "datetime-local" })),
    field("For", spanPick("span", "1h")),
    field("Comment (who is doing what)", h("input", { name: "comment", required: true, maxlength: 1000, size: 40 })),
  ], async (d) => {
    const match = {};
    if (d.get("site_id")) match.site_id = d.get("site_id").trim();
    const sensors = d.get("sensor_ids").split(/[\s,]+/).filter(Boolean);
    if (sensors.length) match.sensor_ids = sensors;
    if (d.get("client_id")) match.client_id = d.get("client_id");
    const types = d.getAll("types");
    if (types.length) match.types = types;
    const start = d.get("starts_at") ? new Date(d.get("starts_at")) : null;
    const body = { match, comment: d.get("comment"),
      ends_at: new Date((start ?? new Date()).getTime() + SPANS[d.get("span")]).toISOString() };
    if (start) body.starts_at = start.toISOString();
    const s = await api("POST", "/v1/silences", body);
    say(`Silence "${s.comment}" made, until ${when(s.ends_at)}.`, true);
    navigate(`#/silences${q({ state: s.state })}`, true);
  }, "Create silence");
  return [h("h1", {}, "Silences"),
    h("p", { class: "muted" }, "While a silence is active, the notifications it matches are kept (status silenced) and never sent; at its end each client it kept something from gets one notification if its view is out of date."),
    filter, list.box, h("h2", {}, "New silence"), create];
}
