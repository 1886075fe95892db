// The latch console: a single page over the public /v1 API, no build step. Routes live in
// the URL fragment (#/sensors/abc), so the server serves one page for all of them. Every
// value from the API reaches the page as text nodes (h() below), never as HTML.

const main = document.getElementById("main");
const notice = document.getElementById("notice");
const liveBadge = document.getElementById("live");
const PAGE = 50;

// --- the API ---------------------------------------------------------------------------

const TOKEN_KEY = "latch.token";
let tokenAsked = null;

/** Asks for a token once (concurrent 401s share the one dialog); resolves when one is set. */
function askToken() {
  if (tokenAsked) return tokenAsked;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  tokenAsked = new Promise((resolve) => {
    form.onsubmit = () => {
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = "";
      tokenAsked = null;
      resolve();
    };
    // Escape would leave every request waiting for a token that never comes.
    dialog.oncancel = (e) => e.preventDefault();
    dialog.showModal();
    input.focus();
  });
  return tokenAsked;
}

function authHeaders() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: `Bearer ${t}` } : {};
}

class ApiError extends Error {}

/** One API call; 401 asks for a token and tries again, any other error is thrown in words. */
async function api(method, path, body) {
  for (;;) {
    const init = { method, headers: authHeaders() };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiError(`latch did not answer (${e.message}).`);
    }
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      await askToken();
      continue;
    }
    const text = await res.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
    if (!res.ok) {
      const msg = json?.error?.message ?? (text || res.statusText);
      throw new ApiError(`${method} ${path}: ${res.status} ${msg}`);
    }
    return json;
  }
}

const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const t = s.toString();
  return t ? `?${t}` : "";
};
const enc = encodeURIComponent;

// --- the DOM ---------------------------------------------------------------------------

/** An element with attributes (on* become listeners) and children (strings become text). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function say(text, ok = false) {
  notice.className = ok ? "ok" : "";
  notice.textContent = text;
}

const when = (t) => (t ? new Date(t).toLocaleString() : "—");
const state = (d) => (d === null || d === undefined ? "—" : String(d));
const badge = (text) => h("span", { class: `badge ${text}` }, text);
// What a client URL names: a webhook, an MQTT topic or an AMQP exchange (a read token
// sees a broker's password as ***).
const destination = (url) => {
  const scheme = (url.split("://")[0] || "").toLowerCase();
  const kind = scheme === "mqtt" ? "MQTT topic" : scheme === "amqp" ? "AMQP exchange" : "webhook";
  return [h("span", { class: "muted" }, `${kind} `), h("span", { class: "mono" }, url)];
};

function table(headers, rows, empty = "Nothing here.") {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows));
}

function field(label, input) {
  const id = `f-${label.toLowerCase().replace(/[^a-z0-9]+/g, "-")}-${Math.random().toString(36).slice(2, 7)}`;
  input.id = id;
  return h("div", {}, h("label", { for: id }, label), input);
}

/** A form whose submit runs `action`, showing its error in words and its success. */
function form(children, action, label) {
  const button = h("button", { type: "submit" }, label);
  const f = h("form", { class: "inline" }, children, button);
  f.addEventListener("submit", async (e) => {
    e.preventDefault();
    button.disabled = true;
    try {
      await action(new FormData(f));
    } catch (err) {
      say(err.message);
    } finally {
      button.disabled = false;
    }
  });
  return f;
}

function actionButton(label, action, cls = "") {
  const b = h("button", { type: "button", class: cls }, label);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await action(); } catch (err) { say(err.message); } finally { b.disabled = false; }
  });
  return b;
}

/** Cursor paging: `load(cursor)` gives a page; Previous goes back through the cursors seen. */
function pager(load, render) {
  const stack = [];
  let cursor = null;
  const box = h("div");
  const go = async () => {
    const page = await load(cursor);
    const prev = h("button", { type: "button", class: "secondary", disabled: !stack.length }, "Previous page");
    const next = h("button", { type: "button", class: "secondary", disabled: !page.next_cursor }, "Next page");
    prev.onclick = () => { cursor = stack.pop(); go().catch((e) => say(e.message)); };
    next.onclick = () => { stack.push(cursor); cursor = page.next_cursor; go().catch((e) => say(e.message)); };
    box.replaceChildren(render(page.items), h("div", { class: "toolbar" }, prev, next));
  };
  return { box, go };
}

// --- live events -----------------------------------------------------------------------

const listeners = new Set();
const recent = [];

/** Reads /v1/stream with fetch (EventSource cannot send a token), reconnecting on loss. */
async function follow() {
  for (;;) {
    try {
      const res = await fetch("/v1/stream", { headers: authHeaders() });
      if (res.status === 401) { await askToken(); continue; }
      if (!res.ok) throw new Error(`status ${res.status}`);
      liveBadge.textContent = "Live";
      liveBadge.className = "live on";
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          dispatch(buf.slice(0, end));
          buf = buf.slice(end + 2);
        }
      }
    } catch { /* reconnect below */ }
    liveBadge.textContent = "Live: reconnecting…";
    liveBadge.className = "live off";
    await new Promise((r) => setTimeout(r, 3000));
  }
}

function dispatch(block) {
  let name = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (!data) return;
  const event = JSON.parse(data);
  if (name === "lagged") { listeners.forEach((f) => f(null)); return; }
  recent.unshift(event);
  recent.length = Math.min(recent.length, 50);
  listeners.forEach((f) => f(event));
}

/** Calls `f` for each live event (`null`: some were missed) while this page is shown. */
function onLive(f) {
  const page = shown;
  listeners.add((e) => { if (page === shown) f(e); });
}

function describe(e) {
  switch (e.type) {
    case "sensor.state_changed": return `state ${state(e.previous)} → ${state(e.data)}` +
      (e.flips_suppressed ? ` (${e.flips_suppressed} flip(s) held back)` : "");
    case "sensor.connection_lost": return "connection lost";
    case "sensor.connection_restored": return "connection restored";
    case "sensor.still_lost": return `still lost (reminder ${e.reminder})`;
    default: return e.type;
  }
}

function feedItem(e, flash = false) {
  return h("li", { class: flash ? "flash" : "" },
    h("a", { href: `#/sensors/${enc(e.sensor_id)}` }, e.sensor_id), " ", describe(e),
    h("span", { class: "muted" }, ` · ${when(e.at)}`));
}

/** Runs `f` at most once per `ms`, at the end of a burst. */
function debounce(f, ms) {
  let t = null;
  return () => { clearTimeout(t); t = setTimeout(f, ms); };
}

// --- charts and rates ------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  el.append(...children);
  return el;
}

/** A line of `points` ({t, v}) over [from, to] in ms; `step` draws a state (held until the next). */
function chart(points, from, to, label, { step = false, max = null } = {}) {
  const W = 600, H = 90, pad = 4;
  const top = max ?? Math.max(1, ...points.map((p) => p.v));
  const x = (t) => pad + ((t - from) / (to - from)) * (W - 2 * pad);
  const y = (v) => H - pad - (v / top) * (H - 2 * pad);
  const coords = [];
  points.forEach((p, i) => {
    if (step && i > 0) coords.push(`${x(p.t)},${y(points[i - 1].v)}`);
    coords.push(`${x(p.t)},${y(p.v)}`);
  });
  if (step && points.length) coords.push(`${x(to)},${y(points[points.length - 1].v)}`);
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "chart", role: "img", "aria-label": label },
    svg("title", {}, label),
    svg("line", { x1: pad, x2: W - pad, y1: H - pad, y2: H - pad, class: "axis" }),
    svg("polyline", { points: coords.join(" "), class: "line" }));
}

/** Samples of this node's counters from /metrics (open, like the page), for rates. */
const samples = [];
const RATE_WINDOW = 5 * 60e3;

function total(text, family, label = "") {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(family) || !"{ ".includes(line[family.length])) continue;
    if (label && !line.includes(label)) continue;
    sum += Number(line.slice(line.lastIndexOf(" ") + 1)) || 0;
  }
  return sum;
}

async function sample() {
  const res = await fetch("/metrics");
  if (!res.ok) throw new ApiError(`GET /metrics: ${res.status}`);
  const text = await res.text();
  samples.push({
    t: Date.now(),
    readings: total(text, "latch_readings_accepted_total"),
    attempts: total(text, "latch_delivery_attempts_total"),
    delivered: total(text, "latch_delivery_attempts_total", 'outcome="delivered"'),
  });
  while (samples[0].t < Date.now() - RATE_WINDOW - 10e3) samples.shift();
}

/** Per-second rates of a sampled counter between consecutive samples. */
function rates(key) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const [a, b] = [samples[i - 1], samples[i]];
    out.push({ t: b.t, v: Math.max(0, (b[key] - a[key]) / ((b.t - a.t) / 1000)) });
  }
  return out;
}

// --- pages -----------------------------------------------------------------------------

async function fleetPage() {
  const cards = h("div", { class: "cards" });
  const historyFrom = h("p", { class: "muted", "aria-label": "History kept from" });
  const feed = h("ul", { class: "feed", "aria-label": "Live events" });
  const draw = async () => {
    const f = await api("GET", "/v1/fleet");
    const card = (cls, n, k, href) => h("a", { class: `card ${cls}`, href }, h("div", { class: "n" }, n), h("div", { class: "k" }, k));
    cards.replaceChildren(
      card("online", f.online, "online", "#/sensors?connection=online"),
      card("lost", f.lost, "lost", "#/sensors?connection=lost"),
      card("unknown", f.unknown, "never reported", "#/sensors?connection=unknown"),
      card("", f.sensors, "sensors registered", "#/sensors"),
      card("", f.notifications_pending, "notifications pending", "#/notifications?status=pending"),
    );
    historyFrom.textContent = f.history_from ? `History kept from ${when(f.history_from)}.` : "No history kept yet.";
  };
  await draw();
  const lost = await api("GET", `/v1/sensors${q({ connection: "lost", limit: 10 })}`);
  const lostList = table(["Lost sensor", "Address", "Last seen"], lost.items.map((s) => h("tr", {},
    h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)), h("td", {}, s.address),
    h("td", {}, when(s.status.last_seen_at)))), "No sensor is lost.");
  const rateBox = h("div", { class: "cols" });
  const drawRates = () => {
    const now = Date.now();
    const panel = (key, name) => {
      const r = rates(key);
      const last = r.length ? r[r.length - 1].v : 0;
      return h("section", { class: "card" }, h("div", { class: "k" }, `${name}, last 5 minutes (this node)`),
        h("div", { class: "n" }, `${last.toFixed(1)}/s`), chart(r, now - RATE_WINDOW, now, `${name} per second`));
    };
    rateBox.replaceChildren(panel("readings", "Readings accepted"), panel("delivered", "Webhooks delivered"));
  };
  const tick = () => sample().then(drawRates).catch((e) => say(e.message));
  await sample().catch(() => {});
  drawRates();
  const timer = setInterval(() => { if (!document.body.contains(rateBox)) clearInterval(timer); else tick(); }, 5000);
  feed.replaceChildren(...(recent.length ? recent.map((e) => feedItem(e)) : [h("li", { class: "muted" }, "No events since this page opened.")]));
  const redraw = debounce(() => draw().catch((e) => say(e.message)), 300);
  onLive((e) => {
    if (e) {
      if (feed.firstChild?.classList.contains("muted")) feed.replaceChildren();
      feed.prepend(feedItem(e, true));
    }
    redraw();
  });
  return [h("h1", {}, "Fleet"), cards, historyFrom, h("h2", {}, "Rates"), rateBox,
    h("div", { class: "cols" },
      h("section", {}, h("h2", {}, "Live events"), feed),
      h("section", {}, h("h2", {}, "Lost sensors"), lostList,
        lost.next_cursor ? h("p", {}, h("a", { href: "#/sensors?connection=lost" }, "All lost sensors")) : ""))];
}

async function sensorsPage(params) {
  const connection = params.get("connection") ?? "";
  const select = h("select", { name: "connection" },
    ["", "online", "lost", "unknown"].map((c) => h("option", { value: c, selected: c === connection }, c || "any")));
  select.addEventListener("change", () => { location.hash = `#/sensors${q({ connection: select.value })}`; });
  const rows = new Map();
  const list = pager(
    (cursor) => api("GET", `/v1/sensors${q({ connection, limit: PAGE, cursor })}`),
    (items) => {
      rows.clear();
      return table(["Sensor", "Address", "State", "Connection", "Last seen"], items.map((s) => {
        const tr = h("tr", {},
          h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)),
          h("td", {}, s.address),
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
        tr.children[2].textContent = state(s.status.data);
        tr.children[3].replaceChildren(badge(s.status.connection));
        tr.children[4].textContent = when(s.status.last_seen_at);
        tr.classList.remove("flash"); void tr.offsetWidth; tr.classList.add("flash");
      }).catch((err) => say(err.message));
    }
  });
  const create = form([
    field("Sensor id", h("input", { name: "id", required: true, maxlength: 16, pattern: "[A-Za-z0-9]{1,16}" })),
    field("Address", h("input", { name: "address", required: true, size: 40 })),
    field("Heartbeat timeout (s)", h("input", { name: "timeout", type: "number", min: 1 })),
  ], async (d) => {
    const body = { id: d.get("id"), address: d.get("address") };
    if (d.get("timeout")) body.heartbeat_timeout_s = Number(d.get("timeout"));
    const s = await api("POST", "/v1/sensors", body);
    say(`Sensor ${s.id} created.`, true);
    navigate(`#/sensors/${enc(s.id)}`, true);
  }, "Create sensor");
  const report = h("div");
  const importForm = form([
    field("CSV: id,address[,heartbeat_timeout_s] per line", h("textarea", { name: "csv", rows: 4, cols: 60, required: true })),
  ], async (d) => {
    const rows = parseCsv(d.get("csv"));
    const results = [];
    for (const [i, row] of rows.entries()) {
      const [id, address, timeout] = row;
      if (i === 0 && id === "id") continue;
      const body = { id: id ?? "", address: address ?? "" };
      if (timeout) body.heartbeat_timeout_s = Number(timeout);
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
    h("div", { class: "toolbar" }, field("Connection", select)), list.box,
    h("h2", {}, "New sensor"), create, h("h2", {}, "Import from CSV"), importForm, report];
}

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

async function sensorPage(id, params) {
  const range = RANGES[params.get("range")] ? params.get("range") : "24h";
  const props = h("dl", { class: "props" });
  const history = h("div");
  const clients = h("div");
  const draw = async () => {
    const s = await api("GET", `/v1/sensors/${enc(id)}`);
    const rows = [["State", state(s.status.data)], ["Connection", badge(s.status.connection)],
      ["Changed at", when(s.status.changed_at)], ["Last seen", when(s.status.last_seen_at)],
      ["Last heard over", s.status.last_source ?? "—"],
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
  const s = await draw();
  await Promise.all([drawHistory(), drawClients()]);
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
  ], async (d) => {
    const body = { address: d.get("address") };
    if (d.get("timeout")) body.heartbeat_timeout_s = Number(d.get("timeout"));
    if (d.get("debounce")) body.debounce_s = Number(d.get("debounce"));
    await api("PUT", `/v1/sensors/${enc(id)}`, body);
    say("Saved.", true);
    await draw();
  }, "Save");
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
    h("h2", {}, "Clients"), clients, link,
    h("div", { class: "toolbar" }, field("History range", rangeSelect)), history,
    h("h2", {}, "Edit"), edit, h("div", { class: "toolbar" }, del)];
}

async function clientsPage() {
  const list = pager(
    (cursor) => api("GET", `/v1/clients${q({ limit: PAGE, cursor })}`),
    (items) => table(["Client", "URL", "Status"], items.map((c) => h("tr", {},
      h("td", {}, h("a", { href: `#/clients/${enc(c.id)}` }, c.name), h("span", { class: "muted mono" }, ` ${c.id}`)),
      h("td", { class: "mono" }, c.url),
      h("td", {}, c.disabled_at ? badge("disabled") : badge("enabled")))), "No clients yet."));
  await list.go();
  const create = form([
    field("Name", h("input", { name: "name", required: true })),
    field("Webhook URL (or mqtt://host/topic, amqp://host/vhost?exchange=…)",
      h("input", { name: "url", type: "url", required: true, size: 40,
        placeholder: "https://…, mqtt://host/doors/{sensor_id}, amqp://host/%2f?exchange=…" })),
  ], async (d) => {
    const c = await api("POST", "/v1/clients", { name: d.get("name"), url: d.get("url") });
    say(`Client ${c.name} created; its signing secret is shown on its page.`, true);
    navigate(`#/clients/${enc(c.id)}`, true);
  }, "Create client");
  return [h("h1", {}, "Clients"), list.box, h("h2", {}, "New client"), create];
}

/** The notification types a client may choose (its `events`). */
const TYPES = ["sensor.state_changed", "sensor.connection_lost", "sensor.connection_restored", "sensor.still_lost"];

/** What a test request came to, in words. */
function testOutcome(r) {
  const took = `${r.duration_ms} ms`;
  if (r.status !== null && r.status >= 200 && r.status < 300) return `Test delivered: HTTP ${r.status} in ${took}.`;
  if (r.status !== null) return `Test answered HTTP ${r.status} in ${took}: ${r.error}`;
  return `Test not delivered after ${took}: ${r.error}`;
}

async function clientPage(id) {
  const props = h("dl", { class: "props" });
  const health = h("dl", { class: "props" });
  const actions = h("div", { class: "toolbar" });
  const tested = h("output", { class: "test-result", "aria-live": "polite" });
  const subscription = h("div");
  const draw = async () => {
    const c = await api("GET", `/v1/clients/${enc(id)}`);
    const rows = [["Name", c.name], ["Destination", destination(c.url)],
      ["Status", c.disabled_at ? [badge("disabled"), ` since ${when(c.disabled_at)} (${c.disabled_reason})`] : badge("enabled")],
      ["Secret", h("span", { class: "mono" }, c.secret ?? "—")],
      ["Previous secret valid until", when(c.previous_secret_expires_at)],
      ["Rate limit", c.rate_limit ? `${c.rate_limit}/s` : "none"],
      ["Receives", c.events ? (c.events.length ? c.events.join(", ") : "nothing") : "every type"],
      ["Created", when(c.created_at)]];
    props.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const x = c.health ?? {};
    const ratio = x.success_ratio_1h === null || x.success_ratio_1h === undefined ? "—" : `${Math.round(x.success_ratio_1h * 100)} %`;
    const hrows = [["Success (last hour)", ratio],
      ["Latency p50 / p99", x.latency_p50_ms_1h === null ? "—" : `${x.latency_p50_ms_1h} / ${x.latency_p99_ms_1h} ms`],
      ["Last success", when(x.last_success_at)], ["Last failure", when(x.last_failure_at)],
      ["Last error", x.last_error ?? "—"], ["Consecutive failures", x.consecutive_failures ?? 0],
      ["Pending", h("a", { href: `#/notifications${q({ client_id: id, status: "pending" })}` }, x.pending ?? 0)],
      ["Failed", h("a", { href: `#/notifications${q({ client_id: id, status: "failed" })}` }, x.failed ?? 0)]];
    health.replaceChildren(...hrows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    actions.replaceChildren(
      actionButton("Send test", async () => {
        tested.textContent = "Sending a test…";
        const r = await api("POST", `/v1/clients/${enc(id)}/test`);
        tested.className = `test-result ${r.error ? "failed" : "ok"}`;
        tested.textContent = testOutcome(r);
      }),
      c.disabled_at ? actionButton("Enable client", async () => {
        await api("POST", `/v1/clients/${enc(id)}/enable`);
        say("Enabled: its pending notifications go out in order.", true);
        await draw();
      }) : "",
      actionButton("Rotate secret", async () => {
        if (!confirm("Make a new signing secret? The old one keeps signing during the grace period.")) return;
        await api("POST", `/v1/clients/${enc(id)}/secret/rotate`, {});
        say("Secret rotated.", true);
        await draw();
      }, "secondary"),
      actionButton("Replay failed notifications", async () => {
        const r = await api("POST", "/v1/notifications/retry", { client_id: id });
        say(`${r.retried} failed notification(s) sent again.`, true);
        await draw();
      }, "secondary"),
      actionButton("Delete client", async () => {
        if (!confirm(`Delete client ${c.name}? Its pending notifications are cancelled.`)) return;
        await api("DELETE", `/v1/clients/${enc(id)}`);
        say(`Client ${c.name} deleted.`, true);
        navigate("#/clients", true);
      }, "danger"));
    const boxes = TYPES.map((t) => h("label", { class: "check" },
      h("input", { type: "checkbox", name: "events", value: t, checked: !c.events || c.events.includes(t) }), ` ${t}`));
    subscription.replaceChildren(form(boxes, async (d) => {
      const chosen = d.getAll("events");
      // Every type ticked is "all": types added later come too.
      const events = chosen.length === TYPES.length ? null : chosen;
      await api("PUT", `/v1/clients/${enc(id)}`, { name: c.name, url: c.url, rate_limit: c.rate_limit, events });
      say("Saved: from now on it receives only what is ticked.", true);
      await draw();
    }, "Save types"));
    return c;
  };
  const c = await draw();
  const sensors = pager(
    (cursor) => api("GET", `/v1/clients/${enc(id)}/sensors${q({ limit: PAGE, cursor })}`),
    (items) => table(["Sensor", "Address", "State", "Connection"], items.map((s) => h("tr", {},
      h("td", {}, h("a", { href: `#/sensors/${enc(s.id)}` }, s.id)), h("td", {}, s.address),
      h("td", { class: "num" }, state(s.status.data)), h("td", {}, badge(s.status.connection)))), "No sensors linked."));
  await sensors.go();
  const link = form([field("Sensor id", h("input", { name: "sensor", required: true, maxlength: 16 }))], async (d) => {
    await api("PUT", `/v1/clients/${enc(id)}/sensors/${enc(d.get("sensor"))}`);
    say("Linked.", true);
    await sensors.go();
  }, "Link sensor");
  return [h("h1", {}, `Client ${c.name}`), props, h("h2", {}, "Endpoint health"), health, actions, tested,
    h("h2", {}, "Notification types"), subscription,
    h("p", {}, h("a", { href: `#/notifications${q({ client_id: id })}` }, "Its notifications")),
    h("h2", {}, "Linked sensors"), sensors.box, link];
}

const STATUSES = ["", "pending", "delivered", "failed", "superseded", "cancelled"];

async function notificationsPage(params) {
  const filter = { client_id: params.get("client_id") ?? "", sensor_id: params.get("sensor_id") ?? "", status: params.get("status") ?? "" };
  const list = pager(
    (cursor) => api("GET", `/v1/notifications${q({ ...filter, limit: PAGE, cursor })}`),
    (items) => table(["Notification", "Sensor", "Client", "Event", "Status", "Attempts", "Created"], items.map((n) => h("tr", {},
      h("td", {}, h("a", { href: `#/notifications/${enc(n.id)}`, class: "mono" }, n.id)),
      h("td", {}, h("a", { href: `#/sensors/${enc(n.sensor_id)}` }, n.sensor_id)),
      h("td", {}, h("a", { href: `#/clients/${enc(n.client_id)}` }, n.client_id)),
      h("td", {}, describe(n)), h("td", {}, badge(n.status)), h("td", { class: "num" }, n.attempt_count),
      h("td", {}, when(n.created_at)))), "No notifications match."));
  await list.go();
  const filters = form([
    field("Client id", h("input", { name: "client_id", value: filter.client_id })),
    field("Sensor id", h("input", { name: "sensor_id", value: filter.sensor_id, maxlength: 16 })),
    field("Status", h("select", { name: "status" }, STATUSES.map((s) => h("option", { value: s, selected: s === filter.status }, s || "any")))),
  ], async (d) => {
    navigate(`#/notifications${q(Object.fromEntries(d.entries()))}`);
  }, "Filter");
  const replay = filter.client_id ? actionButton("Replay the failed ones of this filter", async () => {
    const body = { client_id: filter.client_id };
    if (filter.sensor_id) body.sensor_id = filter.sensor_id;
    const r = await api("POST", "/v1/notifications/retry", body);
    say(`${r.retried} failed notification(s) sent again.`, true);
    await list.go();
  }, "secondary") : h("p", { class: "muted" }, "Filter by a client to replay its failed notifications.");
  return [h("h1", {}, "Notifications"), filters, list.box, h("div", { class: "toolbar" }, replay)];
}

async function notificationPage(id) {
  const props = h("dl", { class: "props" });
  const attempts = h("div");
  const actions = h("div", { class: "toolbar" });
  const draw = async () => {
    const n = await api("GET", `/v1/notifications/${enc(id)}`);
    const rows = [["Event", describe(n)], ["Status", badge(n.status)],
      ["Sensor", h("a", { href: `#/sensors/${enc(n.sensor_id)}` }, n.sensor_id)],
      ["Client", h("a", { href: `#/clients/${enc(n.client_id)}` }, n.client_id)],
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

// --- routing ---------------------------------------------------------------------------

let carryNotice = false;

/** Goes to `hash`, keeping the message just said when `carry`; the same hash again reloads
 * the page (the browser fires no event then). */
function navigate(hash, carry = false) {
  carryNotice = carry;
  if (location.hash === hash) route();
  else location.hash = hash;
}

const routes = [
  [/^\/fleet$/, fleetPage, "fleet"],
  [/^\/sensors$/, sensorsPage, "sensors"],
  [/^\/sensors\/([^/]+)$/, sensorPage, "sensors"],
  [/^\/clients$/, clientsPage, "clients"],
  [/^\/clients\/([^/]+)$/, clientPage, "clients"],
  [/^\/notifications$/, notificationsPage, "notifications"],
  [/^\/notifications\/([^/]+)$/, notificationPage, "notifications"],
];

let shown = 0;

async function route() {
  const hash = location.hash.slice(1) || "/fleet";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  const match = routes.map(([re, page, section]) => [re.exec(path), page, section]).find(([m]) => m);
  listeners.clear();
  const mine = ++shown;
  if (!match) { main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, `No page at ${path}.`)); return; }
  const [m, page, section] = match;
  for (const a of document.querySelectorAll("header nav a")) {
    if (a.getAttribute("href") === `#/${section}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const args = m.slice(1).map(decodeURIComponent);
  try {
    const content = await page(...args, params);
    if (mine !== shown) return;
    main.replaceChildren(...content);
    document.title = `${main.querySelector("h1")?.textContent ?? "latch"} · latch console`;
    main.focus();
  } catch (err) {
    if (mine !== shown) return;
    main.replaceChildren(h("h1", {}, "Could not load this page"), h("p", {}, err.message));
  }
}

window.addEventListener("hashchange", () => {
  // A message said just before navigating (e.g. "created") stays for the next page.
  if (!carryNotice) say("");
  carryNotice = false;
  route();
});
route();
follow();
