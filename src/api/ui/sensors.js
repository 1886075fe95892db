// Sensors: the list (search, connection, site, live rows, create, CSV import) and a
// sensor's page, with its alarms not yet resolved.

import { PAGE, api, q, enc, h, say, when, state, badge, table, field, form, actionButton, pager, onLive, describe, svg, chart, navigate } from "/ui/lib.js";
import { silenceForm, silenceTable, silencesOf } from "/ui/silences.js";
import { alarmTable, unresolved, followAlarms } from "/ui/alarms.js";

export async function sensorsPage(params) {
  const connection = params.get("connection") ?? "";
  const search = params.get("q") ?? "";
  const site = params.get("site_id") ?? "";
  // A door alarm open now: each is a filter of the list (`held=true`, …).
  const ALARMS = { held: "held open too long", flapping: "flapping", battery_low: "battery low", tamper: "tampered" };
  const alarm = ALARMS[params.get("alarm")] ? params.get("alarm") : "";
  const alarmPick = h("select", { name: "alarm" }, h("option", { value: "" }, "any"),
    Object.entries(ALARMS).map(([k, v]) => h("option", { value: k, selected: k === alarm }, v)));
  const select = h("select", { name: "connection" },
    ["", "online", "lost", "unknown"].map((c) => h("option", { value: c, selected: c === connection }, c || "any")));
  // Sites are buildings, few enough to offer them all.
  const sites = await api("GET", `/v1/sites${q({ limit: 1000 })}`);
  const sitePick = h("select", { name: "site_id" }, h("option", { value: "" }, "any"),
    sites.items.map((x) => h("option", { value: x.id, selected: x.id === site }, x.name ? `${x.id} (${x.name})` : x.id)),
    site && !sites.items.some((x) => x.id === site) ? h("option", { value: site, selected: true }, site) : "");
  const find = form([
    field("Search sensors (id prefix or address words)", h("input", { name: "q", type: "search", value: search, maxlength: 200 })),
    field("Connection", select),
    field("Site", sitePick),
    field("Door alarm", alarmPick),
  ], async (d) => { navigate(`#/sensors${q(Object.fromEntries(d.entries()))}`); }, "Search");
  for (const pick of [select, sitePick, alarmPick]) pick.addEventListener("change", () => find.requestSubmit());
  const rows = new Map();
  const list = pager(
    (cursor) => api("GET", `/v1/sensors${q({ connection, q: search, site_id: site, ...(alarm ? { [alarm]: "true" } : {}), limit: PAGE, cursor })}`),
    (items) => {
      rows.clear();
      return table(["Sensor", "Address", "Site", "State", "Connection", "Last seen"], items.map((s) => {
        const tr = h("tr", {},
          h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)),
          h("td", {}, s.address),
          h("td", {}, s.site_id ? h("a", { href: `#/sites/${enc(s.site_id)}` }, s.site_id) : h("span", { class: "muted" }, "—")),
          h("td", { class: "num" }, state(s.status.data)),
          h("td", {}, badge(s.status.connection)),
          h("td", {}, when(s.status.last_seen_at)));
        rows.set(s.id, tr);
        return tr;
      }), "No sensors match.");
    });
  await list.go();
  onLive((e) => {
    if (e && rows.has(e.sensor_id)) {
      api("GET", `/v1/sensors/${enc(e.sensor_id)}`).then((s) => {
        const tr = rows.get(e.sensor_id);
        if (!tr) return;
        tr.children[3].textContent = state(s.status.data);
        tr.children[4].replaceChildren(badge(s.status.connection));
        tr.children[5].textContent = when(s.status.last_seen_at);
        tr.classList.remove("flash"); void tr.offsetWidth; tr.classList.add("flash");
      }).catch((err) => say(err.message));
    }
  });
  const create = form([
    field("Sensor id", h("input", { name: "id", required: true, maxlength: 16, pattern: "[A-Za-z0-9]{1,16}" })),
    field("Address", h("input", { name: "address", required: true, size: 40 })),
    field("Heartbeat timeout (s)", h("input", { name: "timeout", type: "number", min: 1 })),
    field("Site id", h("input", { name: "site_id", maxlength: 64, size: 12 })),
  ], async (d) => {
    const body = { id: d.get("id"), address: d.get("address") };
    if (d.get("timeout")) body.heartbeat_timeout_s = Number(d.get("timeout"));
    if (d.get("site_id")) body.site_id = d.get("site_id");
    const s = await api("POST", "/v1/sensors", body);
    say(`Sensor ${s.id} created.`, true);
    navigate(`#/sensors/${enc(s.id)}`, true);
  }, "Create sensor");
  const report = h("div");
  const importForm = form([
    field(`CSV: ${CSV_COLUMNS.join(",")} per line (the last two optional; a header line may name them in another order)`,
      h("textarea", { name: "csv", rows: 4, cols: 60, required: true })),
  ], async (d) => {
    const rows = parseCsv(d.get("csv"));
    const columns = rows[0]?.[0] === "id" ? rows[0] : CSV_COLUMNS;
    const unknown = columns.filter((c) => !CSV_COLUMNS.includes(c));
    if (unknown.length) throw new Error(`Import: unknown column(s) ${unknown.join(", ")}; the columns are ${CSV_COLUMNS.join(", ")}.`);
    const results = [];
    for (const [i, row] of rows.entries()) {
      if (i === 0 && columns === rows[0]) continue;
      const v = Object.fromEntries(columns.map((c, k) => [c, row[k] ?? ""]));
      const id = v.id;
      const body = { id, address: v.address };
      if (v.heartbeat_timeout_s) body.heartbeat_timeout_s = Number(v.heartbeat_timeout_s);
      if (v.site_id) body.site_id = v.site_id;
      try {
        await api("POST", "/v1/sensors", body);
        results.push([i + 1, id, "created"]);
      } catch (err) {
        results.push([i + 1, id, err.message]);
      }
    }
    const ok = results.filter((r) => r[2] === "created").length;
    say(`Import: ${ok} of ${results.length} row(s) created.`, ok === results.length);
    report.replaceChildren(table(["Line", "Sensor", "Result"], results.map(([n, id, r]) =>
      h("tr", {}, h("td", { class: "num" }, n), h("td", {}, id), h("td", {}, r)))));
    await list.go();
  }, "Import");
  return [h("h1", {}, "Sensors"),
    find, list.box,
    h("h2", {}, "New sensor"), create, h("h2", {}, "Import from CSV"), importForm, report];
}

/** The columns of a CSV import, in the order a file without a header line gives them. */
const CSV_COLUMNS = ["id", "address", "heartbeat_timeout_s", "site_id"];

/** CSV rows: fields split on commas, double quotes around a field that holds one. */
function parseCsv(text) {
  return text.split(/\r?\n/).filter((l) => l.trim()).map((line) => {
    const fields = [];
    let cur = "", quoted = false;
    for (let i = 0; i < line.length; i++) {
      const c = line[i];
      if (quoted) {
        if (c === '"' && line[i + 1] === '"') { cur += '"'; i++; } else if (c === '"') quoted = false; else cur += c;
      } else if (c === '"') quoted = true;
      else if (c === ",") { fields.push(cur.trim()); cur = ""; } else cur += c;
    }
    fields.push(cur.trim());
    return fields;
  });
}

const RANGES = { "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3 };

export async function sensorPage(id, params) {
  const range = RANGES[params.get("range")] ? params.get("range") : "24h";
  const props = h("dl", { class: "props" });
  const history = h("div");
  const clients = h("div");
  const draw = async () => {
    const s = await api("GET", `/v1/sensors/${enc(id)}`);
    const rows = [["State", state(s.status.data)], ["Connection", badge(s.status.connection)],
      ["Changed at", when(s.status.changed_at)], ["Last seen", when(s.status.last_seen_at)],
      ["Last heard over", s.status.last_source ?? "—"],
      ["Battery", s.status.battery === null || s.status.battery === undefined ? "—"
        : `${s.status.battery} %` + (s.battery_low_pct && s.status.battery <= s.battery_low_pct ? " (low)" : "")],
      ["Tamper", s.status.tamper === null || s.status.tamper === undefined ? "—" : s.status.tamper ? "tampered" : "no"],
      ["Fault", s.status.fault ?? "none"],
      ["Battery alarm at", s.battery_low_pct ? `${s.battery_low_pct} % or below` : "off"],
      ["Labels", s.labels ? `0: ${s.labels["0"] ?? "—"}, 1: ${s.labels["1"] ?? "—"}` : "none"],
      ["Hold alarms", (s.hold_alarms ?? []).length ? s.hold_alarms.map((a) =>
        `${s.labels?.[String(a.data)] ?? a.data} for ${a.after_s} s` + (a.remind_every_s ? `, then every ${a.remind_every_s} s` : "")).join("; ") : "none"],
      ["Held since", s.status.held_since ? when(s.status.held_since) : "—"],
      ["Flapping at", s.flap ? `${s.flap.changes} changes within ${s.flap.window_s} s` : "off"],
      ["Flaps now", s.status.flapping ? "yes: its changes are not sent until it is quiet" : "no"],
      ["Armed", s.armed ? [`${s.labels?.[String(s.armed.data)] ?? s.armed.data} ${s.armed.when} the hours of schedule `,
        h("span", { class: "mono" }, s.armed.schedule_id), " is told as sensor.state_out_of_schedule"] : "no"],
      ["Site", s.site_id ? h("a", { href: `#/sites/${enc(s.site_id)}` }, s.site_id) : "none"],
      ["Address", s.address], ["Heartbeat timeout", s.heartbeat_timeout_s ? `${s.heartbeat_timeout_s} s` : "service default"],
      ["Debounce", s.debounce_s === null || s.debounce_s === undefined ? "service default" : `${s.debounce_s} s`],
      ["Created", when(s.created_at)]];
    props.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    return s;
  };
  const drawHistory = async () => {
    const from = new Date(Date.now() - RANGES[range]).toISOString();
    const [events, readings] = await Promise.all([
      api("GET", `/v1/sensors/${enc(id)}/events${q({ from, limit: 1000 })}`),
      api("GET", `/v1/sensors/${enc(id)}/readings${q({ from, limit: 1000 })}`),
    ]);
    const to = Date.now();
    const points = readings.items.map((r) => ({ t: Date.parse(r.ts), v: r.data }));
    const lostAt = events.items.filter((e) => e.type === "sensor.connection_lost").map((e) => Date.parse(e.at));
    const timeline = chart(points, to - RANGES[range], to, `Readings of ${id} over the last ${range}`, { step: true, max: 1 });
    for (const t of lostAt) {
      const x = 4 + ((t - (to - RANGES[range])) / RANGES[range]) * 592;
      timeline.append(svg("line", { x1: x, x2: x, y1: 0, y2: 90, class: "lost" }));
    }
    history.replaceChildren(h("figure", {}, timeline,
      h("figcaption", { class: "muted" }, `State over the last ${range}; red lines: connection lost.${readings.next_cursor ? " First 1000 readings of the range." : ""}`)),
      h("div", { class: "cols" },
      h("section", { "aria-label": "Events" }, h("h2", {}, "Events (newest first)"),
        table(["At", "Event"], events.items.slice().reverse().map((e) =>
          h("tr", {}, h("td", {}, when(e.at)), h("td", {}, describe(e)))), "No events in this range.")),
      h("section", { "aria-label": "Readings" }, h("h2", {}, "Readings (newest first)"),
        table(["Device time", "Value", "Received", ""], readings.items.slice().reverse().slice(0, 200).map((r) =>
          h("tr", {}, h("td", {}, when(r.ts)), h("td", { class: "num" }, r.data), h("td", {}, when(r.received_at)),
            h("td", { class: "muted" }, r.late ? "late" : ""))), "No readings in this range."))));
  };
  const drawClients = async () => {
    const page = await api("GET", `/v1/sensors/${enc(id)}/clients${q({ limit: 1000 })}`);
    clients.replaceChildren(table(["Client", "URL", ""], page.items.map((c) => h("tr", {},
      h("td", {}, h("a", { href: `#/clients/${enc(c.id)}` }, c.name), h("span", { class: "muted mono" }, ` ${c.id}`)),
      h("td", { class: "mono" }, c.url),
      h("td", {}, actionButton(`Unlink ${c.name}`, async () => {
        await api("DELETE", `/v1/clients/${enc(c.id)}/sensors/${enc(id)}`);
        say(`Unlinked ${c.name}.`, true);
        await drawClients();
      }, "secondary")))), "No client receives this sensor's notifications."));
  };
  const silences = h("div");
  // Those naming this sensor, and those of its site (they hold its notifications too).
  const drawSilences = async () => {
    const site = (await api("GET", `/v1/sensors/${enc(id)}`)).site_id;
    const mine = await silencesOf((m) => m.sensor_ids?.includes(id) || (site && m.site_id === site));
    silences.replaceChildren(silenceTable(mine, null, drawSilences, "No silence holds this sensor's notifications."));
  };
  const alarms = h("div");
  const drawAlarms = async () => {
    const mine = await unresolved({ sensor_id: id });
    alarms.replaceChildren(alarmTable(mine.items, drawAlarms, "No alarm of this sensor is open."));
  };
  const s = await draw();
  await Promise.all([drawHistory(), drawClients(), drawSilences(), drawAlarms()]);
  followAlarms(alarms, drawAlarms, (e) => e.sensor_id === id);
  onLive((e) => {
    if (!e || e.sensor_id === id) Promise.all([draw(), drawHistory()]).catch((err) => say(err.message));
  });

  const choices = await api("GET", `/v1/clients${q({ limit: 1000 })}`);
  const pick = h("select", { name: "client", required: true },
    h("option", { value: "" }, "choose a client"),
    choices.items.map((c) => h("option", { value: c.id }, `${c.name} (${c.id})`)));
  const link = form([field("Client", pick)], async (d) => {
    await api("PUT", `/v1/clients/${enc(d.get("client"))}/sensors/${enc(id)}`);
    say("Linked.", true);
    await drawClients();
  }, "Link client");
  const edit = form([
    field("Address", h("input", { name: "address", required: true, size: 40, value: s.address })),
    field("Heartbeat timeout (s)", h("input", { name: "timeout", type: "number", min: 1, value: s.heartbeat_timeout_s ?? "" })),
    field("Debounce (s)", h("input", { name: "debounce", type: "number", min: 0, max: 86400, value: s.debounce_s ?? "" })),
    // A replace without it would take the sensor out of its site.
    field("Site id", h("input", { name: "site_id", maxlength: 64, size: 12, value: s.site_id ?? "" })),
  ], async (d) => {
    // Settings this form does not show are sent back as they are now (the arming form may
    // have changed one since the page was drawn): a replace without them would reset them.
    const cur = await api("GET", `/v1/sensors/${enc(id)}`);
    const body = { address: d.get("address"), battery_low_pct: cur.battery_low_pct, labels: cur.labels ?? null,
      hold_alarms: cur.hold_alarms ?? [], flap: cur.flap ?? null, armed: cur.armed ?? null };
    if (d.get("site_id")) body.site_id = d.get("site_id");
    if (d.get("timeout")) body.heartbeat_timeout_s = Number(d.get("timeout"));
    if (d.get("debounce")) body.debounce_s = Number(d.get("debounce"));
    await api("PUT", `/v1/sensors/${enc(id)}`, body);
    say("Saved.", true);
    await draw();
  }, "Save");
  const arming = await armingForm(id, s, draw);
  const rangeSelect = h("select", {}, Object.keys(RANGES).map((r) => h("option", { value: r, selected: r === range }, `last ${r}`)));
  rangeSelect.addEventListener("change", () => { location.hash = `#/sensors/${enc(id)}${q({ range: rangeSelect.value })}`; });
  const del = actionButton("Delete sensor", async () => {
    if (!confirm(`Delete sensor ${id} with its links, state and history?`)) return;
    await api("DELETE", `/v1/sensors/${enc(id)}`);
    say(`Sensor ${id} deleted.`, true);
    navigate("#/sensors", true);
  }, "danger");
  return [h("h1", {}, `Sensor ${id}`), props,
    h("p", {}, h("a", { href: `#/notifications${q({ sensor_id: id })}` }, "Its notifications")),
    h("section", { "aria-label": "Alarms of this sensor" }, h("h2", {}, "Alarms"), alarms),
    h("h2", {}, "Clients"), clients, link,
    h("section", { "aria-label": "Silences of this sensor" }, h("h2", {}, "Silences"), silences,
      silenceForm({ sensor_ids: [id] }, "Silence this sensor", drawSilences)),
    h("div", { class: "toolbar" }, field("History range", rangeSelect)), history,
    h("h2", {}, "Edit"), edit,
    h("h2", {}, "Arming"),
    h("p", { class: "muted" }, "An armed sensor whose state becomes the armed value outside (or inside) a schedule's hours is told as sensor.state_out_of_schedule, and opens an alarm: a door opened at night."),
    arming, h("div", { class: "toolbar" }, del)];
}

/** Arms the sensor on a schedule, or disarms it (a merge patch of `armed`). */
async function armingForm(id, s, changed) {
  const schedules = (await api("GET", `/v1/schedules${q({ limit: 1000 })}`)).items;
  const label = (d) => s.labels?.[String(d)] ? `${d} (${s.labels[String(d)]})` : String(d);
  const schedule = h("select", { name: "schedule_id" }, h("option", { value: "" }, "not armed"),
    schedules.map((x) => h("option", { value: x.id, selected: s.armed?.schedule_id === x.id }, `${x.name} (${x.tz})`)));
  const data = h("select", { name: "data" }, [1, 0].map((d) => h("option", { value: d, selected: (s.armed?.data ?? 1) === d }, label(d))));
  const whenPick = h("select", { name: "when" }, ["outside", "inside"].map((w) =>
    h("option", { value: w, selected: (s.armed?.when ?? "outside") === w }, `${w} its hours`)));
  return form([field("Schedule", schedule), field("Armed value", data), field("Told when", whenPick)], async (d) => {
    const armed = d.get("schedule_id") ? { schedule_id: d.get("schedule_id"), data: Number(d.get("data")), when: d.get("when") } : null;
    await api("PATCH", `/v1/sensors/${enc(id)}`, { armed });
    say(armed ? `Armed on ${armed.schedule_id}.` : "Disarmed.", true);
    await changed();
  }, "Save arming");
}

