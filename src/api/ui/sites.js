// Sites: the buildings sensors are installed in. The list shows the sites down first, each
// with its lost sensors, then every site; a site's page shows its state, its sensors and
// its silences, and makes a silence for it. Both follow the live stream.

import { PAGE, api, q, enc, h, say, when, state, badge, table, field, form, pager, onLive, debounce, navigate } from "/ui/lib.js";
import { silenceForm, silenceTable, silencesOf } from "/ui/silences.js";

/** Lost sensors shown beside a down site on the list (its page has them all). */
const LOST_SHOWN = 10;

/** Whether a live event may change what a site page or the list shows: a site's change, or
 * a sensor lost or back (the counts). */
const touchesSites = (e) => !e || e.site_id || e.type === "sensor.connection_lost" || e.type === "sensor.connection_restored";

const siteLink = (s) => h("a", { href: `#/sites/${enc(s.id)}` }, s.id);
const lostOf = (s) => `${s.status.lost} of ${s.status.sensors}`;

/** A site's lost sensors, linked, the first `LOST_SHOWN`. */
async function lostList(site) {
  const page = await api("GET", `/v1/sites/${enc(site.id)}/sensors${q({ connection: "lost", limit: LOST_SHOWN })}`);
  if (!page.items.length) return h("span", { class: "muted" }, "none");
  return h("span", {}, page.items.flatMap((s, i) => [i ? ", " : "", h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)]),
    page.next_cursor ? h("span", { class: "muted" }, ` and ${site.status.lost - page.items.length} more`) : "");
}

export async function sitesPage() {
  const down = h("div");
  const drawDown = async () => {
    const page = await api("GET", `/v1/sites${q({ state: "down", limit: PAGE })}`);
    const lost = await Promise.all(page.items.map(lostList));
    down.replaceChildren(table(["Site", "Name", "Down since", "Lost", "Lost sensors"], page.items.map((s, i) => h("tr", {},
      h("td", {}, siteLink(s)), h("td", {}, s.name ?? "—"), h("td", {}, when(s.status.since)),
      h("td", { class: "num" }, lostOf(s)), h("td", {}, lost[i]))), "No site is down."),
      page.next_cursor ? h("p", { class: "muted" }, `The first ${page.items.length} sites down, by id.`) : "");
  };
  const all = pager(
    (cursor) => api("GET", `/v1/sites${q({ limit: PAGE, cursor })}`),
    (items) => table(["Site", "Name", "Address", "State", "Since", "Lost", "Gateway"], items.map((s) => h("tr", {},
      h("td", {}, siteLink(s)), h("td", {}, s.name ?? "—"), h("td", {}, s.address ?? "—"),
      h("td", {}, badge(s.status.state)), h("td", {}, when(s.status.since)),
      h("td", { class: "num" }, lostOf(s)),
      h("td", {}, s.gateway_sensor_id ? h("a", { href: `#/sensors/${enc(s.gateway_sensor_id)}` }, s.gateway_sensor_id) : "—"))),
    "No sites yet: a site groups the sensors of one building, so that one alarm stands for all of them."));
  await Promise.all([drawDown(), all.go()]);
  const redraw = debounce(() => Promise.all([drawDown(), all.go()]).catch((e) => say(e.message)), 500);
  onLive((e) => { if (touchesSites(e)) redraw(); });
  const create = form([
    field("Site id", h("input", { name: "id", required: true, maxlength: 64, pattern: "[A-Za-z0-9._\\-]{1,64}" })),
    field("Name", h("input", { name: "name", maxlength: 512 })),
    field("Address", h("input", { name: "address", maxlength: 512, size: 40 })),
    field("Gateway sensor id", h("input", { name: "gateway", maxlength: 16 })),
  ], async (d) => {
    const body = { id: d.get("id") };
    for (const [k, f] of [["name", "name"], ["address", "address"], ["gateway_sensor_id", "gateway"]]) {
      if (d.get(f)) body[k] = d.get(f);
    }
    const s = await api("POST", "/v1/sites", body);
    say(`Site ${s.id} created. Put sensors in it with their site_id.`, true);
    navigate(`#/sites/${enc(s.id)}`, true);
  }, "Create site");
  return [h("h1", {}, "Sites"),
    h("section", { "aria-label": "Sites down" }, h("h2", {}, "Down"), down),
    h("section", { "aria-label": "All sites" }, h("h2", {}, "All sites"), all.box),
    h("h2", {}, "New site"), create];
}

export async function sitePage(id) {
  const props = h("dl", { class: "props" });
  const lost = h("div");
  const silences = h("div");
  const draw = async () => {
    const s = await api("GET", `/v1/sites/${enc(id)}`);
    const rows = [["State", badge(s.status.state)], [s.status.state === "down" ? "Down since" : "Up since", when(s.status.since)],
      ["Sensors", s.status.sensors], ["Lost now", s.status.lost],
      ["Name", s.name ?? "—"], ["Address", s.address ?? "—"],
      ["Gateway sensor", s.gateway_sensor_id ? h("a", { href: `#/sensors/${enc(s.gateway_sensor_id)}` }, s.gateway_sensor_id) : "none"],
      ["Created", when(s.created_at)]];
    props.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const page = await api("GET", `/v1/sites/${enc(id)}/sensors${q({ connection: "lost", limit: 1000 })}`);
    lost.replaceChildren(sensorTable(page.items, "No sensor of this site is lost."),
      page.next_cursor ? h("p", { class: "muted" }, "The first 1000, by id.") : "");
  };
  const sensors = pager(
    (cursor) => api("GET", `/v1/sites/${enc(id)}/sensors${q({ limit: PAGE, cursor })}`),
    (items) => sensorTable(items, "No sensors in this site yet: give a sensor this site's id as its site_id."));
  const drawSilences = async () => {
    const mine = await silencesOf((m) => m.site_id === id);
    silences.replaceChildren(silenceTable(mine, null, drawSilences, "No silence holds this site's notifications."));
  };
  await Promise.all([draw(), sensors.go(), drawSilences()]);
  const redraw = debounce(() => Promise.all([draw(), sensors.go()]).catch((e) => say(e.message)), 500);
  onLive((e) => { if (touchesSites(e) && (!e || !e.site_id || e.site_id === id)) redraw(); });
  return [h("h1", {}, `Site ${id}`), props,
    h("p", { class: "toolbar" }, h("a", { href: "#/sites" }, "All sites"),
      h("a", { href: `#/notifications${q({ site_id: id })}` }, "Its notifications"),
      h("a", { href: `#/sensors${q({ site_id: id })}` }, "Its sensors in the sensor list")),
    h("section", { "aria-label": "Lost sensors" }, h("h2", {}, "Lost sensors"), lost),
    h("section", { "aria-label": "Silences of this site" }, h("h2", {}, "Silences"), silences,
      silenceForm({ site_id: id }, "Silence this site", drawSilences)),
    h("section", { "aria-label": "Sensors of this site" }, h("h2", {}, "Sensors"), sensors.box)];
}

function sensorTable(items, empty) {
  return table(["Sensor", "Address", "State", "Connection", "Last seen"], items.map((s) => h("tr", {},
    h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)), h("td", {}, s.address),
    h("td", { class: "num" }, state(s.status.data)), h("td", {}, badge(s.status.connection)),
    h("td", {}, when(s.status.last_seen_at)))), empty);
}
