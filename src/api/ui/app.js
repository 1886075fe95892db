// The latch console: a single page over the public /v1 API, no build step. Routes live in
// the URL fragment (#/sensors/abc), so the server serves one page for all of them; each
// section is a module (fleet.js, alarms.js, sensors.js, sites.js, silences.js, clients.js,
// schedules.js, notifications.js, audit.js) over lib.js.

import { main, liveBadge, h, say, authHeaders, askToken, listeners, recent, shown, carry, setRouter } from "/ui/lib.js";
import { fleetPage } from "/ui/fleet.js";
import { alarmsPage } from "/ui/alarms.js";
import { sensorsPage, sensorPage } from "/ui/sensors.js";
import { clientsPage, clientPage } from "/ui/clients.js";
import { notificationsPage, notificationPage } from "/ui/notifications.js";
import { sitesPage, sitePage } from "/ui/sites.js";
import { silencesPage } from "/ui/silences.js";
import { auditPage } from "/ui/audit.js";
import { schedulesPage } from "/ui/schedules.js";

// --- live events -----------------------------------------------------------------------

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

// --- routing ---------------------------------------------------------------------------

const routes = [
  [/^\/fleet$/, fleetPage, "fleet"],
  [/^\/alarms$/, alarmsPage, "alarms"],
  [/^\/sensors$/, sensorsPage, "sensors"],
  [/^\/sensors\/([^/]+)$/, sensorPage, "sensors"],
  [/^\/sites$/, sitesPage, "sites"],
  [/^\/sites\/([^/]+)$/, sitePage, "sites"],
  [/^\/silences$/, silencesPage, "silences"],
  [/^\/schedules$/, schedulesPage, "schedules"],
  [/^\/clients$/, clientsPage, "clients"],
  [/^\/clients\/([^/]+)$/, clientPage, "clients"],
  [/^\/notifications$/, notificationsPage, "notifications"],
  [/^\/notifications\/([^/]+)$/, notificationPage, "notifications"],
  [/^\/audit$/, auditPage, "audit"],
];

async function route() {
  const hash = location.hash.slice(1) || "/fleet";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  const match = routes.map(([re, page, section]) => [re.exec(path), page, section]).find(([m]) => m);
  listeners.clear();
  const mine = ++shown.n;
  if (!match) { main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, `No page at ${path}.`)); return; }
  const [m, page, section] = match;
  for (const a of document.querySelectorAll("header nav a")) {
    if (a.getAttribute("href") === `#/${section}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const args = m.slice(1).map(decodeURIComponent);
  try {
    const content = await page(...args, params);
    if (mine !== shown.n) return;
    main.replaceChildren(...content);
    document.title = `${main.querySelector("h1")?.textContent ?? "latch"} · latch console`;
    // A new page starts at its top, under the header; focus moves to it for screen readers
    // without scrolling (focusing a page taller than the window scrolls the header away).
    window.scrollTo(0, 0);
    main.focus({ preventScroll: true });
  } catch (err) {
    if (mine !== shown.n) return;
    main.replaceChildren(h("h1", {}, "Could not load this page"), h("p", {}, err.message));
  }
}

window.addEventListener("hashchange", () => {
  // A message said just before navigating (e.g. "created") stays for the next page.
  if (!carry.notice) say("");
  carry.notice = false;
  route();
});
setRouter(route);
route();
follow();
