// Notifications: newest first with their clients' names, filtered by client, sensor, site,
// type, status and time, "failed in the last hour" in one click, and replay from the
// filtered view; one notification and its attempts. A site's event shows its site and the
// sensors it named, not the one whose lane it travels in.

import { PAGE, api, q, enc, h, say, when, badge, table, field, form, actionButton, pager, describe, navigate, ago, clientNames, eventTypes } from "/ui/lib.js";

const STATUSES = ["", "pending", "delivered", "failed", "superseded", "cancelled", "silenced"];
/** Time ranges of the filter, back from now. */
const SINCE = { "": 0, "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3 };
const SINCE_NAMES = { "": "any time", "1h": "the last hour", "24h": "the last 24 hours", "7d": "the last 7 days" };

/** Sensors a site's event names in the list (its page names them all). */
const NAMED_SHOWN = 5;

/** Sensors, linked, the first `shown` of them. */
function sensorLinks(ids, shown = ids.length) {
  return h("span", {}, ids.slice(0, shown).flatMap((s, i) => [i ? ", " : "", h("a", { href: `#/sensors/${enc(s)}` }, s)]),
    ids.length > shown ? h("span", { class: "muted" }, ` and ${ids.length - shown} more`) : "");
}

/** What a notification is about in the list: its sensor, or a site's event's site and
 * the sensors it named. */
function about(n) {
  if (!n.site_id) return sensorLinks([n.sensor_id]);
  const named = n.sensor_ids ?? [];
  return h("span", {}, h("a", { href: `#/sites/${enc(n.site_id)}` }, `Site ${n.site_id}`),
    named.length ? ": " : "", sensorLinks(named, NAMED_SHOWN));
}

export async function notificationsPage(params) {
  const get = (k) => params.get(k) ?? "";
  const filter = { client_id: get("client_id"), sensor_id: get("sensor_id"), site_id: get("site_id"), status: get("status"), type: get("type") };
  const since = SINCE[get("since")] ? get("since") : "";
  // The range is fixed when the page loads, so paging on keeps to one set of rows.
  const from = since ? ago(SINCE[since]) : "";
  const names = await clientNames();
  const types = ["", ...(await eventTypes()).map((t) => t.type)];
  const list = pager(
    (cursor) => api("GET", `/v1/notifications${q({ ...filter, from, order: "desc", limit: PAGE, cursor })}`),
    (items) => {
      names.fill(items.map((n) => n.client_id)).catch(() => {});
      return table(["Created", "Event", "Sensor or site", "Client", "Status", "Attempts", "Notification"], items.map((n) => h("tr", {},
        h("td", {}, when(n.created_at)), h("td", {}, describe(n)),
        h("td", {}, about(n)),
        h("td", {}, names.link(n.client_id)),
        h("td", {}, badge(n.status)), h("td", { class: "num" }, n.attempt_count),
        h("td", {}, h("a", { href: `#/notifications/${enc(n.id)}`, class: "mono" }, n.id)))), "No notifications match.");
    });
  await list.go();
  const clientPick = h("select", { name: "client_id" }, h("option", { value: "" }, "any"),
    [...names.all()].map(([id, name]) => h("option", { value: id, selected: id === filter.client_id }, name)),
    filter.client_id && !names.has(filter.client_id) ? h("option", { value: filter.client_id, selected: true }, filter.client_id) : "");
  const filters = form([
    field("Client", clientPick),
    field("Sensor id", h("input", { name: "sensor_id", value: filter.sensor_id, maxlength: 16, size: 16 })),
    field("Site id", h("input", { name: "site_id", value: filter.site_id, maxlength: 64, size: 12 })),
    field("Type", h("select", { name: "type" }, types.map((t) => h("option", { value: t, selected: t === filter.type }, t || "any")))),
    field("Status", h("select", { name: "status" }, STATUSES.map((s) => h("option", { value: s, selected: s === filter.status }, s || "any")))),
    field("Created in", h("select", { name: "since" }, Object.keys(SINCE).map((s) => h("option", { value: s, selected: s === since }, SINCE_NAMES[s])))),
  ], async (d) => {
    navigate(`#/notifications${q(Object.fromEntries(d.entries()))}`);
  }, "Filter");
  const failedLastHour = h("a", { class: "button", href: `#/notifications${q({ status: "failed", since: "1h" })}` }, "Failed in the last hour");
  return [h("h1", {}, "Notifications"), h("div", { class: "toolbar" }, failedLastHour, h("span", { class: "muted" }, "Newest first.")),
    filters, list.box, h("div", { class: "toolbar" }, replayButton(filter, from, since, names, list))];
}

/** Replays the failed notifications the view holds: those of its client (or of every
 * client), of its sensor, created since its range began. Bulk replay takes no type or
 * status, so with a type chosen it says it replays every failed one of the others. */
function replayButton(filter, from, since, names, list) {
  const whose = filter.client_id ? names.name(filter.client_id) : "every client";
  const scope = [whose, filter.sensor_id ? `sensor ${filter.sensor_id}` : "", since ? `created in ${SINCE_NAMES[since]}` : ""].filter(Boolean).join(", ");
  const label = `Replay the failed ones (${scope}${filter.type ? ", every type" : ""}${filter.site_id ? ", every site" : ""})`;
  return actionButton(label, async () => {
    const clients = filter.client_id ? [filter.client_id] : [...names.all().keys()];
    let retried = 0;
    for (const client_id of clients) {
      const body = { client_id };
      if (filter.sensor_id) body.sensor_id = filter.sensor_id;
      if (from) body.since = from;
      retried += (await api("POST", "/v1/notifications/retry", body)).retried;
    }
    say(`${retried} failed notification(s) sent again.`, true);
    await list.go();
  }, "secondary");
}

export async function notificationPage(id) {
  const props = h("dl", { class: "props" });
  const attempts = h("div");
  const actions = h("div", { class: "toolbar" });
  const names = await clientNames();
  const draw = async () => {
    const n = await api("GET", `/v1/notifications/${enc(id)}`);
    await names.fill([n.client_id]).catch(() => {});
    const rows = [["Event", describe(n)], ["Status", badge(n.status)],
      ...(n.site_id ? [["Site", h("a", { href: `#/sites/${enc(n.site_id)}` }, n.site_id)],
        ["Sensors named", sensorLinks(n.sensor_ids ?? [])]] : [["Sensor", sensorLinks([n.sensor_id])]]),
      ["Client", names.link(n.client_id)],
      ["Occurred", when(n.occurred_at)], ["Created", when(n.created_at)], ["Updated", when(n.updated_at)],
      ["Next attempt", when(n.next_attempt_at)], ["Attempts this round", n.attempt_count]];
    props.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    attempts.replaceChildren(table(["At", "Status code", "Error", "Duration"], n.attempts.map((a) => h("tr", {},
      h("td", {}, when(a.at)), h("td", { class: "num" }, a.status_code ?? "none"), h("td", {}, a.error ?? ""),
      h("td", { class: "num" }, `${a.duration_ms} ms`))), "No attempts yet."));
    actions.replaceChildren(n.status === "failed" ? actionButton("Replay", async () => {
      await api("POST", `/v1/notifications/${enc(id)}/retry`);
      say("Sent again: it is pending.", true);
      await draw();
    }) : "", actionButton("Refresh", draw, "secondary"));
  };
  await draw();
  return [h("h1", {}, "Notification"), h("p", { class: "mono" }, id), props, actions, h("h2", {}, "Attempts"), attempts];
}
