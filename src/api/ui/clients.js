// Clients: the list (search, create) and a client's page (health and its chart, Send test,
// the types it receives, what its receiver needs beyond a signature, its sensors).

import { PAGE, api, q, enc, h, say, when, state, badge, destination, table, field, form, actionButton, pager, svg, chart, navigate, eventTypes } from "/ui/lib.js";

export async function clientsPage(params) {
  const search = params.get("q") ?? "";
  const find = form([
    field("Find clients", h("input", { name: "q", type: "search", value: search, maxlength: 200 })),
  ], async (d) => { navigate(`#/clients${q(Object.fromEntries(d.entries()))}`); }, "Search");
  const list = pager(
    (cursor) => api("GET", `/v1/clients${q({ q: search, limit: PAGE, cursor })}`),
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
  return [h("h1", {}, "Clients"), find, list.box, h("h2", {}, "New client"), create];
}

/** The client's last hour in 5-minute slices: the share of attempts that failed, and the
 * median attempt duration. */
function deliveryChart(series) {
  if (!series.length) return "";
  const slice = 300e3;
  const from = Date.parse(series[0].at);
  const to = from + series.length * slice;
  const mid = (b) => Date.parse(b.at) + slice / 2;
  const tried = series.filter((b) => b.attempts > 0);
  const failure = tried.map((b) => ({ t: mid(b), v: (100 * b.failed) / b.attempts }));
  const latency = tried.map((b) => ({ t: mid(b), v: b.latency_p50_ms }));
  const attempts = series.reduce((a, b) => a + b.attempts, 0);
  const failed = series.reduce((a, b) => a + b.failed, 0);
  const failures = chart(failure, from, to, "Failed attempts, percent, last hour", { max: 100, cls: "fail" });
  return [
    h("figure", {}, failures, h("figcaption", { class: "muted" },
      `Failure rate, last hour: ${attempts ? Math.round((100 * failed) / attempts) : 0} % of ${attempts} attempt(s), in 5-minute slices.`)),
    h("figure", {}, chart(latency, from, to, "Median attempt duration, ms, last hour"), h("figcaption", { class: "muted" },
      `Delivery latency (median attempt, ms), last hour${tried.length ? `: ${Math.max(...latency.map((p) => p.v))} ms at most` : ": no attempts"}.`)),
  ];
}

/** How latch authenticates to the client's receiver, in words (never its secret). */
function authText(a) {
  if (!a) return "none";
  if (a.type === "bearer") return "bearer token";
  if (a.type === "basic") return `basic, user ${a.username}`;
  return `OAuth2 client credentials: ${a.client_id} at ${a.token_url}${a.scope ? `, scope ${a.scope}` : ""}`;
}

/** `Name: value` lines as a headers object; a line without a colon is an error. */
function parseHeaders(text) {
  const out = {};
  for (const [i, line] of text.split("\n").entries()) {
    if (!line.trim()) continue;
    const at = line.indexOf(":");
    if (at < 1) throw new Error(`Headers, line ${i + 1}: write it as Name: value`);
    out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return out;
}

/** The form of a client's receiver settings: headers (values kept while they read
 * "[redacted]"), authentication (kept unless another is chosen), client certificate
 * (kept unless a new one is pasted or it is removed). Saving sends the client back with
 * them, as the API replaces a client. */
function receiverForm(c, saved) {
  const headers = h("textarea", { name: "headers", rows: 3, cols: 60, spellcheck: "false",
    placeholder: "X-Api-Key: …" }, Object.keys(c.headers).map((n) => `${n}: [redacted]`).join("\n"));
  const kinds = [["keep", c.auth ? `unchanged (${authText(c.auth)})` : "unchanged (none)"], ["none", "none"],
    ["bearer", "bearer token"], ["basic", "basic (user and password)"],
    ["oauth2_client_credentials", "OAuth2 client credentials"]];
  const kind = h("select", { name: "auth_type" }, kinds.map(([v, l]) => h("option", { value: v }, l)));
  const input = (name, attrs = {}) => h("input", { name, size: 40, ...attrs });
  const parts = {
    bearer: [field("Token", input("token", { type: "password", autocomplete: "off" }))],
    basic: [field("User", input("username")), field("Password", input("password", { type: "password", autocomplete: "off" }))],
    oauth2_client_credentials: [field("Token URL", input("token_url", { type: "url" })), field("Client id", input("client_id")),
      field("Client secret", input("client_secret", { type: "password", autocomplete: "off" })),
      field("Scope (optional)", input("scope")), field("Audience (optional)", input("audience"))],
  };
  const authFields = h("div");
  const showAuth = () => authFields.replaceChildren(...(parts[kind.value] ?? []));
  kind.addEventListener("change", showAuth);
  const pem = (name, rows) => h("textarea", { name, rows, cols: 64, spellcheck: "false", placeholder: "-----BEGIN …-----" });
  const remove = h("label", { class: "check" }, h("input", { type: "checkbox", name: "tls_remove" }), " remove the certificate");
  return form([
    field("Headers (one Name: value a line; [redacted] keeps a value)", headers),
    field("Authentication", kind), authFields,
    field("Client certificate (PEM; leave empty to keep the current one)", pem("client_cert_pem", 4)),
    field("Its private key (PEM)", pem("client_key_pem", 4)),
    field("CA of the receiver (PEM, optional: instead of the system's roots)", pem("ca_pem", 3)),
    c.tls ? remove : "",
  ], async (d) => {
    const body = { name: c.name, url: c.url, rate_limit: c.rate_limit, events: c.events, batch: c.batch,
      headers: parseHeaders(d.get("headers")) };
    const type = d.get("auth_type");
    const text = (k) => (d.get(k) ?? "").trim();
    if (type === "none") body.auth = null;
    else if (type === "bearer") body.auth = { type, token: text("token") };
    else if (type === "basic") body.auth = { type, username: text("username"), password: d.get("password") ?? "" };
    else if (type !== "keep") {
      body.auth = { type, token_url: text("token_url"), client_id: text("client_id"), client_secret: text("client_secret") };
      if (text("scope")) body.auth.scope = text("scope");
      if (text("audience")) body.auth.audience = text("audience");
    }
    if (text("client_cert_pem")) {
      body.tls = { client_cert_pem: d.get("client_cert_pem"), client_key_pem: d.get("client_key_pem") };
      if (text("ca_pem")) body.tls.ca_pem = d.get("ca_pem");
    } else if (d.get("tls_remove")) body.tls = null;
    await api("PUT", `/v1/clients/${enc(c.id)}`, body);
    say("Saved: its next requests carry these settings.", true);
    await saved();
  }, "Save receiver settings");
}

/** The types a client receives, one box each as the API lists them, with what each means.
 * Saving sends the boxes' choice only when it differs from what the page showed: saved
 * as it came, the client keeps its `events` exactly (all types stays all, those added
 * later included). A listed type the page does not offer (`client.test`) is kept. */
function typesForm(c, types, saved) {
  const offered = types.map((t) => t.type);
  const shown = offered.filter((t) => !c.events || c.events.includes(t));
  const rows = types.map((t) => h("div", { class: "type" },
    h("label", { class: "check" }, h("input", { type: "checkbox", name: "events", value: t.type,
      checked: shown.includes(t.type) }), ` ${t.type}`),
    h("span", { class: "muted" }, ` ${t.description}`)));
  return form(rows, async (d) => {
    const chosen = d.getAll("events");
    let events = c.events;
    if (chosen.join() !== shown.join()) {
      // Every type ticked is "all": types added later come too.
      events = chosen.length === offered.length ? null
        : [...chosen, ...(c.events ?? []).filter((t) => !offered.includes(t))];
    }
    await api("PUT", `/v1/clients/${enc(c.id)}`, { name: c.name, url: c.url, rate_limit: c.rate_limit, events, batch: c.batch });
    say(events === c.events ? "Saved: nothing changed." : "Saved: from now on it receives only what is ticked.", true);
    await saved();
  }, "Save types");
}

/** What a test request came to, in words. */
function testOutcome(r) {
  const took = `${r.duration_ms} ms`;
  if (r.status !== null && r.status >= 200 && r.status < 300) return `Test delivered: HTTP ${r.status} in ${took}.`;
  if (r.status !== null) return `Test answered HTTP ${r.status} in ${took}: ${r.error}`;
  return `Test not delivered after ${took}: ${r.error}`;
}

/** Where an alarm left untaken goes from client `c`: the chain of escalations, each `to`
 * read in turn (five at most, as latch allows), as links with their waits. */
async function escalationChain(c) {
  if (!c.escalation) return "none: an alarm it is told of goes nowhere else";
  const parts = [];
  let at = c;
  for (let level = 1; at?.escalation && level <= 5; level += 1) {
    const { after_s, to } = at.escalation;
    let next = null;
    try { next = await api("GET", `/v1/clients/${enc(to)}`); } catch { /* deleted meanwhile */ }
    parts.push(` → after ${after_s} s, level ${level}: `,
      h("a", { href: `#/clients/${enc(to)}` }, next ? next.name : `${to} (gone)`));
    at = next;
  }
  return [h("span", {}, c.name), ...parts];
}

/** Sets or clears the client's escalation (a merge patch of `escalation`). */
function escalationForm(c, names, changed) {
  const to = h("select", { name: "to" }, h("option", { value: "" }, "nobody (no escalation)"),
    [...names].filter(([id]) => id !== c.id).map(([id, name]) =>
      h("option", { value: id, selected: c.escalation?.to === id }, name)));
  return form([
    field("Escalate an untaken alarm to", to),
    field("After (seconds)", h("input", { name: "after_s", type: "number", min: 1, max: 604800, value: c.escalation?.after_s ?? 300 })),
  ], async (d) => {
    const escalation = d.get("to") ? { after_s: Number(d.get("after_s")), to: d.get("to") } : null;
    await api("PATCH", `/v1/clients/${enc(c.id)}`, { escalation });
    say(escalation ? `Untaken alarms go on to ${names.get(escalation.to)} after ${escalation.after_s} s.` : "No escalation.", true);
    await changed();
  }, "Save escalation");
}

export async function clientPage(id) {
  const props = h("dl", { class: "props" });
  const health = h("dl", { class: "props" });
  const actions = h("div", { class: "toolbar" });
  const tested = h("output", { class: "test-result", "aria-live": "polite" });
  const subscription = h("div");
  const receiver = h("div");
  const escalation = h("div");
  const recentChart = h("div", { class: "cols" });
  const draw = async () => {
    const c = await api("GET", `/v1/clients/${enc(id)}`);
    const rows = [["Name", c.name], ["Destination", destination(c.url)],
      ["Status", c.disabled_at ? [badge("disabled"), ` since ${when(c.disabled_at)} (${c.disabled_reason})`] : badge("enabled")],
      ["Secret", h("span", { class: "mono" }, c.secret ?? "—")],
      ["Previous secret valid until", when(c.previous_secret_expires_at)],
      ["Rate limit", c.rate_limit ? `${c.rate_limit}/s` : "none"],
      ["Receives", c.events ? (c.events.length ? c.events.join(", ") : "nothing") : "every type"],
      ["Batches", c.batch ? `up to ${c.batch.max_events} a request, waiting ${c.batch.max_wait_ms} ms` : "one notification a request"],
      ["Headers", Object.keys(c.headers).length ? h("span", { class: "mono" }, Object.keys(c.headers).map((n) => `${n}: [redacted]`).join(", ")) : "none"],
      ["Authentication", authText(c.auth)],
      ["Client certificate", c.tls ? `${c.tls.subject}, expires ${when(c.tls.expires_at)}${c.tls.ca_subject ? `; receiver verified with ${c.tls.ca_subject}` : ""}` : "none"],
      ["Escalation", await escalationChain(c)],
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
    recentChart.replaceChildren(...[deliveryChart(x.series_1h ?? [])].flat());
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
    subscription.replaceChildren(typesForm(c, types, draw));
    receiver.replaceChildren(receiverForm(c, draw));
    const names = new Map((await api("GET", `/v1/clients${q({ limit: 1000 })}`)).items.map((x) => [x.id, x.name]));
    escalation.replaceChildren(escalationForm(c, names, draw));
    return c;
  };
  const types = await eventTypes();
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
  return [h("h1", {}, `Client ${c.name}`), props, h("h2", {}, "Endpoint health"), health, recentChart, actions, tested,
    h("h2", {}, "Notification types"), subscription,
    h("h2", {}, "Escalation"),
    h("p", { class: "muted" }, "An alarm this client is told of and nobody acknowledges goes on, after the wait, to the next client as alarm.escalated; that client's own escalation continues the chain (five levels at most)."),
    escalation,
    h("h2", {}, "Receiver settings"),
    h("p", { class: "muted" }, "For receivers that want more than the signature. Values, tokens, passwords and keys are write-only: they are never shown again."),
    receiver,
    h("p", {}, h("a", { href: `#/notifications${q({ client_id: id })}` }, "Its notifications")),
    h("h2", {}, "Linked sensors"), sensors.box, link];
}

