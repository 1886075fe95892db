// The audit trail (issue #73): who changed what through the API, newest first, each change
// with the resource before and after (secrets redacted by latch), filtered by resource and
// token. Admin tokens only: a read token is told so.

import { PAGE, api, q, enc, h, when, table, field, form, pager, navigate } from "/ui/lib.js";

/** A record's `before` or `after`, folded: one line a row until opened. */
function shownJson(label, v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "—");
  return h("details", {}, h("summary", {}, label), h("pre", {}, JSON.stringify(v, null, 2)));
}

/** Where a record's resource is in the console, when it has a page there. */
function resourceLink(resource) {
  const [kind, id] = resource.split("/");
  const pages = { sensors: "sensors", sites: "sites", clients: "clients", notifications: "notifications" };
  return pages[kind] && id ? h("a", { href: `#/${pages[kind]}/${enc(id)}` }, resource) : resource;
}

export async function auditPage(params) {
  const resource = params.get("resource") ?? "";
  const token = params.get("token_id") ?? "";
  const list = pager(
    (cursor) => api("GET", `/v1/audit${q({ resource, token_id: token, limit: PAGE, cursor })}`),
    (items) => table(["When", "Token", "Change", "Resource", "Before", "After"], items.map((e) => h("tr", {},
      h("td", {}, when(e.at)),
      h("td", {}, e.token ? h("a", { href: `#/audit${q({ token_id: e.token.id })}` }, e.token.name) : h("span", { class: "muted" }, "open API")),
      h("td", {}, h("code", {}, `${e.method} ${e.path}`)),
      h("td", {}, resourceLink(e.resource)),
      h("td", {}, shownJson("before", e.before)),
      h("td", {}, shownJson("after", e.after)))),
    resource || token ? "No change matches." : "No change made through the API yet."));
  await list.go();
  const filter = form([
    field("Resource (and what is below it)", h("input", { name: "resource", value: resource, size: 30, placeholder: "sensors/front-door" })),
    field("Token id", h("input", { name: "token_id", value: token, size: 28 })),
  ], async (d) => navigate(`#/audit${q({ resource: d.get("resource").trim(), token_id: d.get("token_id").trim() })}`), "Show");
  return [h("h1", {}, "Audit trail"),
    h("p", { class: "muted" }, "Every change made through the API, newest first: which token made it, and the resource before and after. Secrets never appear. Kept as long as notifications."),
    filter, list.box];
}
