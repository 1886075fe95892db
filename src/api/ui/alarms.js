// Alarms (issue #73): the desk's work list, open first, each acknowledged with who took it and why.

import { api, q, enc, h, say, when, badge, table, field, form, onLive, debounce, navigate } from "/ui/lib.js";

const KINDS = ["connection_lost", "site_down", "state_held", "battery_low", "tamper", "fault", "flapping", "out_of_schedule"];
/** Resolved alarms shown: the latest only, the rest is history. */
const RESOLVED_SHOWN = 50;
/** The last name acknowledged with in this browser: a desk takes many alarms in a row. */
const BY_KEY = "latch.ack_by";

/** The open alarms matching `filter`, then the acknowledged (each newest first, the
 * newest 1000 of each: `more` says there are others). */
export async function unresolved(filter = {}) {
  const [open, taken] = await Promise.all(["open", "acknowledged"].map((state) =>
    api("GET", `/v1/alarms${q({ ...filter, state, limit: 1000 })}`)));
  return { items: [...open.items, ...taken.items], more: Boolean(open.next_cursor || taken.next_cursor) };
}

/** A form that acknowledges `a`, behind a disclosure so the table stays one line a row. */
function ackForm(a, changed) {
  return h("details", {}, h("summary", {}, "Acknowledge"), form([
    field("By (who takes it)", h("input", { name: "by", required: true, maxlength: 200, value: localStorage.getItem(BY_KEY) ?? "" })),
    field("Note", h("input", { name: "note", maxlength: 2000, size: 30 })),
  ], async (d) => {
    const by = d.get("by").trim();
    const taken = await api("POST", `/v1/alarms/${enc(a.id)}/ack`, { by, note: d.get("note").trim() || null });
    localStorage.setItem(BY_KEY, by);
    say(`Alarm ${taken.kind} of ${taken.sensor_id ?? taken.site_id} acknowledged by ${taken.acknowledged_by}.`, true);
    await changed();
  }, "Acknowledge"));
}

/** Notifications of an alarm the chain shows, at most: the first ones, which hold its
 * escalations (reminders of a long alarm come later). */
const CHAIN_SHOWN = 30;

/** Who was told of `a` and when, read when opened: its notifications in the order made —
 * the clients it opened for, each `alarm.escalated` to the next client up the chain, the
 * acknowledgement and the end — with each one's client and status. */
function chain(a) {
  const box = h("div", {}, "Loading…");
  const details = h("details", {}, h("summary", {}, "Who was told"), box);
  details.addEventListener("toggle", async () => {
    if (!details.open) return;
    try {
      const { notification_ids: ids } = await api("GET", `/v1/alarms/${enc(a.id)}`);
      const shown = await Promise.all(ids.slice(0, CHAIN_SHOWN).map((n) => api("GET", `/v1/notifications/${enc(n)}`)));
      const names = new Map();
      for (const c of new Set(shown.map((n) => n.client_id))) {
        try { names.set(c, (await api("GET", `/v1/clients/${enc(c)}`)).name); } catch { names.set(c, `${c} (deleted)`); }
      }
      box.replaceChildren(h("ol", { class: "chain" }, shown.map((n) => h("li", {},
        h("a", { href: `#/notifications/${enc(n.id)}` }, n.type), " to ",
        h("a", { href: `#/clients/${enc(n.client_id)}` }, names.get(n.client_id)), " ", badge(n.status),
        h("span", { class: "muted" }, ` · ${when(n.created_at)}`)))),
        ids.length > CHAIN_SHOWN ? h("p", { class: "muted" }, `The first ${CHAIN_SHOWN} of ${ids.length}.`) : "");
    } catch (e) {
      box.replaceChildren(e.message);
    }
  });
  return details;
}

/** A table of alarms, an open one with its Acknowledge control; `changed` runs after one
 * is acknowledged. */
export function alarmTable(items, changed, empty) {
  return table(["Kind", "Sensor or site", "State", "Opened", "Acknowledged", "Resolved", "Told", ""], items.map((a) => h("tr", {},
    h("td", {}, a.kind),
    h("td", {}, a.sensor_id ? h("a", { href: `#/sensors/${enc(a.sensor_id)}` }, a.sensor_id)
      : a.site_id ? h("a", { href: `#/sites/${enc(a.site_id)}` }, `Site ${a.site_id}`) : "—"),
    h("td", {}, badge(a.state)),
    h("td", {}, when(a.opened_at)),
    h("td", {}, a.acknowledged_by ? [`by ${a.acknowledged_by}`, h("span", { class: "muted" }, ` · ${when(a.acknowledged_at)}`),
      a.note ? h("div", {}, a.note) : ""] : "—"),
    h("td", {}, when(a.resolved_at)),
    h("td", {}, chain(a)),
    h("td", {}, a.state === "open" ? ackForm(a, changed) : ""))), empty);
}

/** Redraws `box` with `draw` on live events that may open or resolve an alarm, unless an
 * Acknowledge form is open in it (a redraw would lose what is being typed). */
export function followAlarms(box, draw, mine = () => true) {
  const redraw = debounce(() => { if (!box.querySelector("details[open]")) draw().catch((e) => say(e.message)); }, 500);
  onLive((e) => { if (!e || (e.type !== "sensor.state_changed" && mine(e))) redraw(); });
}

export async function alarmsPage(params) {
  const kind = KINDS.includes(params.get("kind")) ? params.get("kind") : "";
  const box = h("div");
  const draw = async () => {
    const [live, resolved] = await Promise.all([unresolved({ kind }),
      api("GET", `/v1/alarms${q({ kind, state: "resolved", limit: RESOLVED_SHOWN })}`)]);
    const what = kind ? `${kind} alarm` : "alarm";
    box.replaceChildren(
      h("section", { "aria-label": "Open and acknowledged alarms" }, h("h2", {}, "Open, then acknowledged"),
        alarmTable(live.items, draw, `No ${what} is open or acknowledged.`),
        live.more ? h("p", { class: "muted" }, "The newest 1000 open and the newest 1000 acknowledged.") : ""),
      h("section", { "aria-label": "Resolved alarms" }, h("h2", {}, `Resolved (the latest ${RESOLVED_SHOWN})`),
        alarmTable(resolved.items, draw, `No ${what} resolved yet.`)));
  };
  await draw();
  followAlarms(box, draw);
  const pick = h("select", { name: "kind" }, h("option", { value: "" }, "any"),
    KINDS.map((k) => h("option", { value: k, selected: k === kind }, k)));
  const filter = form([field("Kind", pick)], async (d) => navigate(`#/alarms${q({ kind: d.get("kind") })}`), "Show");
  pick.addEventListener("change", () => filter.requestSubmit());
  return [h("h1", {}, "Alarms"),
    h("p", { class: "muted" }, "One alarm per sensor and kind while it is open, however many clients were told. Acknowledging it stops its reminders and tells those clients who took it."),
    filter, box];
}
