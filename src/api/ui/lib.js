// The console's shared parts: the API with its token, building the DOM from text (every
// value from the API reaches the page as text nodes, never as HTML), the live events'
// listeners, charts, and moving between pages. The pages are modules of their own.

export const main = document.getElementById("main");
const notice = document.getElementById("notice");
export const liveBadge = document.getElementById("live");
export const PAGE = 50;

// --- the API ---------------------------------------------------------------------------

const TOKEN_KEY = "latch.token";
let tokenAsked = null;

/** Asks for a token once (concurrent 401s share the one dialog); resolves when one is set. */
export function askToken() {
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

export function authHeaders() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: `Bearer ${t}` } : {};
}

export class ApiError extends Error {}

/** One API call; 401 asks for a token and tries again, any other error is thrown in words. */
export async function api(method, path, body) {
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

export const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const t = s.toString();
  return t ? `?${t}` : "";
};
export const enc = encodeURIComponent;

// --- the DOM ---------------------------------------------------------------------------

/** An element with attributes (on* become listeners) and children (strings become text). */
export function h(tag, attrs = {}, ...children) {
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

export function say(text, ok = false) {
  notice.className = ok ? "ok" : "";
  notice.textContent = text;
}

/** A time in the browser's zone, which it names: an operator comparing it with a log or a
 * colleague's screen must know which zone it is in. */
const WHEN = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  second: "2-digit", timeZoneName: "short" };
export const when = (t) => (t ? new Date(t).toLocaleString(undefined, WHEN) : "—");
export const state = (d) => (d === null || d === undefined ? "—" : String(d));
export const badge = (text) => h("span", { class: `badge ${text}` }, text);
// What a client URL names: a webhook, an MQTT topic or an AMQP exchange (a read token
// sees a broker's password as ***).
export const destination = (url) => {
  const scheme = (url.split("://")[0] || "").toLowerCase();
  const kind = scheme === "mqtt" ? "MQTT topic" : scheme === "amqp" ? "AMQP exchange" : "webhook";
  return [h("span", { class: "muted" }, `${kind} `), h("span", { class: "mono" }, url)];
};

export function table(headers, rows, empty = "Nothing here.") {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows));
}

export function field(label, input) {
  const id = `f-${label.toLowerCase().replace(/[^a-z0-9]+/g, "-")}-${Math.random().toString(36).slice(2, 7)}`;
  input.id = id;
  return h("div", {}, h("label", { for: id }, label), input);
}

/** A form whose submit runs `action`, showing its error in words and its success. */
export function form(children, action, label) {
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

export function actionButton(label, action, cls = "") {
  const b = h("button", { type: "button", class: cls }, label);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await action(); } catch (err) { say(err.message); } finally { b.disabled = false; }
  });
  return b;
}

/** Cursor paging: `load(cursor)` gives a page; Previous goes back through the cursors seen. */
export function pager(load, render) {
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

export const listeners = new Set();
export const recent = [];


/** Calls `f` for each live event (`null`: some were missed) while this page is shown. */
export function onLive(f) {
  const page = shown.n;
  listeners.add((e) => { if (page === shown.n) f(e); });
}

export function describe(e) {
  switch (e.type) {
    case "sensor.state_changed": return `state ${state(e.previous)} → ${state(e.data)}` +
      (e.flips_suppressed ? ` (${e.flips_suppressed} flip(s) held back)` : "");
    case "sensor.connection_lost": return "connection lost";
    case "sensor.connection_restored": return "connection restored";
    case "sensor.still_lost": return `still lost (reminder ${e.reminder})`;
    // On the live stream a site's event counts its sensors; a notification's has none.
    case "site.connection_lost": return e.sensors === undefined ? "site down" : `site down: ${e.lost} of ${e.sensors} sensors lost`;
    case "site.connection_restored": return e.sensors === undefined ? "site back up" : `site back up: ${e.lost} of ${e.sensors} sensors still lost`;
    case "sensor.battery_low": return e.battery === undefined ? "battery low" : `battery low: ${e.battery} %`;
    case "sensor.battery_ok": return e.battery === undefined ? "battery ok" : `battery ok: ${e.battery} %`;
    case "sensor.tamper": return "tampered with";
    case "sensor.tamper_cleared": return "tampering ended";
    case "sensor.fault": return e.fault === undefined ? "fault" : `fault: ${e.fault}`;
    case "sensor.fault_cleared": return "fault cleared";
    default: return e.type;
  }
}

/** One live event: a sensor's, or a site's (named by the site, linked to its page). */
export function feedItem(e, flash = false) {
  const what = e.site_id
    ? h("a", { href: `#/sites/${enc(e.site_id)}` }, `Site ${e.site_id}`)
    : h("a", { href: `#/sensors/${enc(e.sensor_id)}` }, e.sensor_id);
  return h("li", { class: `${flash ? "flash" : ""} ${e.site_id ? "site" : ""}`.trim() || null },
    what, " ", describe(e), h("span", { class: "muted" }, ` · ${when(e.at)}`));
}

/** Runs `f` at most once per `ms`, at the end of a burst. */
export function debounce(f, ms) {
  let t = null;
  return () => { clearTimeout(t); t = setTimeout(f, ms); };
}


// --- charts and rates ------------------------------------------------------------------

export const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  el.append(...children);
  return el;
}

/** A line of `points` ({t, v}) over [from, to] in ms; `step` draws a state (held until the
 * next). A single point is drawn as a dot: a line through one point draws nothing, and a
 * chart with one 5-minute slice would look empty. `cls` styles the line and the dot. */
export function chart(points, from, to, label, { step = false, max = null, cls = "line" } = {}) {
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
  const marks = !step && points.length === 1
    ? [svg("circle", { cx: x(points[0].t), cy: y(points[0].v), r: 4, class: `dot ${cls}` })]
    : [];
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "chart", role: "img", "aria-label": label },
    svg("title", {}, label),
    svg("line", { x1: pad, x2: W - pad, y1: H - pad, y2: H - pad, class: "axis" }),
    svg("polyline", { points: coords.join(" "), class: cls }), ...marks);
}


// --- moving between pages ----------------------------------------------------------------

/** The page on show (a counter): a page's late answers and live listeners stop counting
 * once another is shown. */
export const shown = { n: 0 };
let router = () => {};
export const carry = { notice: false };

/** The router `navigate` calls when the hash does not change (app.js sets it). */
export function setRouter(f) { router = f; }

/** Goes to `hash`, keeping the message just said when `keep`; the same hash again reloads
 * the page (the browser fires no event then). */
export function navigate(hash, keep = false) {
  carry.notice = keep;
  if (location.hash === hash) router();
  else location.hash = hash;
}

/** A time `ms` milliseconds ago, as the API takes it. */
export const ago = (ms) => new Date(Date.now() - ms).toISOString();

let typesAsked = null;

/** Types the catalog lists that are no sensor's or site's notification: `batch` is the
 * envelope of several, `client.test` is sent on request only and never kept. No client
 * chooses them, no silence or list of notifications names them. */
const NOT_CHOSEN = ["batch", "client.test"];

/** The notification types a client may choose, each with what it means: the API's one list
 * (`GET /v1/event-types`), asked once. A page that kept its own list fell behind it. */
export function eventTypes() {
  typesAsked ??= api("GET", "/v1/event-types").then((r) => r.items.filter((t) => !NOT_CHOSEN.includes(t.type)))
    .catch((e) => { typesAsked = null; throw e; });
  return typesAsked;
}

/** Clients' names by id for a page: the first 1000 clients at once, any other when a row
 * names it (a deleted client shows its id). Links are filled in as names arrive. */
export async function clientNames() {
  const known = new Map();
  const page = await api("GET", `/v1/clients${q({ limit: 1000 })}`);
  for (const c of page.items) known.set(c.id, c.name);
  const waiting = new Map();
  return {
    all: () => known,
    has: (id) => known.has(id),
    name: (id) => known.get(id) ?? id,
    /** A link to the client, named once its name is known. */
    link(id) {
      const a = h("a", { href: `#/clients/${enc(id)}` }, known.get(id) ?? id);
      if (!known.has(id)) (waiting.get(id) ?? waiting.set(id, []).get(id)).push(a);
      return a;
    },
    /** Looks up the names of `ids` not known yet. */
    async fill(ids) {
      for (const id of new Set(ids)) {
        if (known.has(id)) continue;
        let name = id;
        try { name = (await api("GET", `/v1/clients/${enc(id)}`)).name; } catch { name = `${id} (deleted)`; }
        known.set(id, name);
        for (const a of waiting.get(id) ?? []) a.textContent = name;
        waiting.delete(id);
      }
    },
  };
}
