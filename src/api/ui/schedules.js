// Schedules (issue #73): weekly hours in a time zone, which silences follow and sensors are
// armed on. The list shows whether each is inside its hours now and when that changes;
// one is made here with one weekly window (more through the API), or deleted when nothing
// follows it.

import { PAGE, api, q, enc, h, say, when, badge, table, field, form, actionButton, pager, navigate } from "/ui/lib.js";

const DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/** A schedule's windows in words: `mon, tue 08:00–18:00; sat 10:00–14:00`. */
function windows(s) {
  return s.weekly.map((w) => `${w.days.join(", ")} ${w.from}–${w.to}${w.from > w.to ? " (past midnight)" : ""}`).join("; ");
}

export async function schedulesPage() {
  const list = pager(
    (cursor) => api("GET", `/v1/schedules${q({ limit: PAGE, cursor })}`),
    (items) => table(["Schedule", "Time zone", "Hours", "Except", "Now", ""], items.map((s) => h("tr", {},
      h("td", {}, s.name, h("span", { class: "muted mono" }, ` ${s.id}`)),
      h("td", {}, s.tz),
      h("td", {}, windows(s)),
      h("td", {}, (s.except ?? []).join(", ") || "—"),
      h("td", {}, badge(s.status.inside ? "inside" : "outside"),
        h("span", { class: "muted" }, s.status.next_change ? ` until ${when(s.status.next_change)}` : "")),
      h("td", {}, actionButton(`Delete ${s.name}`, async () => {
        if (!confirm(`Delete schedule ${s.name}?`)) return;
        await api("DELETE", `/v1/schedules/${enc(s.id)}`);
        say(`Schedule ${s.name} deleted.`, true);
        await list.go();
      }, "danger")))), "No schedules yet."));
  await list.go();
  const zones = h("datalist", { id: "time-zones" },
    (Intl.supportedValuesOf?.("timeZone") ?? []).map((z) => h("option", { value: z })));
  const create = form([
    field("Id", h("input", { name: "id", required: true, maxlength: 64, size: 16, placeholder: "office-hours" })),
    field("Name", h("input", { name: "name", required: true, size: 24, placeholder: "Office hours" })),
    field("Time zone", h("input", { name: "tz", required: true, list: "time-zones", size: 20,
      value: Intl.DateTimeFormat().resolvedOptions().timeZone })),
    h("fieldset", {}, h("legend", {}, "Days"), DAYS.map((d) => h("label", {},
      h("input", { type: "checkbox", name: "days", value: d, checked: !["sat", "sun"].includes(d) }), ` ${d} `))),
    field("From", h("input", { name: "from", type: "time", required: true, value: "08:00" })),
    field("To (a time before From runs past midnight)", h("input", { name: "to", type: "time", required: true, value: "18:00" })),
    field("Except (dates, comma between)", h("input", { name: "except", size: 30, placeholder: "2026-12-25, 2026-12-26" })),
  ], async (d) => {
    const except = d.get("except").split(/[\s,]+/).filter(Boolean);
    const body = { id: d.get("id").trim(), name: d.get("name").trim(), tz: d.get("tz").trim(),
      weekly: [{ days: d.getAll("days"), from: d.get("from"), to: d.get("to") }] };
    if (except.length) body.except = except;
    const s = await api("POST", "/v1/schedules", body);
    say(`Schedule ${s.name} made: ${s.status.inside ? "inside" : "outside"} its hours now.`, true);
    navigate("#/schedules", true);
  }, "Create schedule");
  return [h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Weekly hours in a time zone, daylight-saving changes included. A silence may follow one (active in every window), and a sensor may be armed on one (a door opened outside its hours is an alarm)."),
    list.box, h("h2", {}, "New schedule"), zones, create];
}
