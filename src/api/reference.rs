//! The book's reference (issue #75), generated from the code so it cannot drift: every
//! setting (from the commented defaults and the declared bounds), the HTTP API (from the
//! OpenAPI document latch serves), every notification body (from the event catalog) and
//! every metric family (from their one list). A test regenerates the pages and compares
//! them with `docs/src/reference/`; `LATCH_BLESS=1` writes them instead.

use std::fmt::Write;

use serde_json::Value;

use crate::config::described;
use crate::delivery::catalog::catalog;
use crate::telemetry::families::{ALL, Kind};

/// Each page of the reference: its file name under `docs/src/reference/` and its text.
pub fn pages() -> Vec<(&'static str, String)> {
    vec![
        ("settings.md", settings()),
        ("api.md", api()),
        ("events.md", events()),
        ("metrics.md", metrics()),
    ]
}

const GENERATED: &str = "<!-- Generated from the code by `src/api/reference.rs`: do not edit. \
                         `LATCH_BLESS=1 cargo test --lib api::reference` writes it again. -->";

/// The id mdBook gives a heading, so links can name it: lower case, spaces to `-`, only
/// letters, digits, `-` and `_` kept.
pub fn heading_id(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

fn settings() -> String {
    let all = described();
    let mut out = format!(
        "{GENERATED}\n\n# Settings\n\nEvery setting latch takes, from the defaults embedded in the \
         binary (`latch config --defaults` prints them). Settings are layered: these defaults, \
         then `latch.toml` (or the file named by `--config` / `LATCH_CONFIG`), then the \
         variables. A bad value or an unknown key stops latch at start with a message naming \
         it. Durations are written like `500ms`, `30s`, `1h`, `90d`.\n\n\
         | setting | variable | default | bounds |\n|---|---|---|---|\n"
    );
    for d in &all {
        let default = d.default.as_deref().map_or("unset".into(), code);
        let bounds = d.bounds.as_deref().unwrap_or("");
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | `{}` | {default} | {bounds} |",
            d.key,
            heading_id(&d.key),
            d.variable
        );
    }
    for d in &all {
        let _ = write!(out, "\n## {}\n\n- Variable: `{}`\n", d.key, d.variable);
        match (&d.default, &d.example) {
            (Some(v), _) => {
                let _ = writeln!(out, "- Default: {}", code(v));
            }
            (None, Some(e)) => {
                let _ = writeln!(out, "- Default: unset (for example {})", code(e));
            }
            (None, None) => out.push_str("- Default: unset\n"),
        }
        if let Some(b) = &d.bounds {
            let _ = writeln!(out, "- Bounds: {b}");
        }
        if d.secret {
            out.push_str("- A secret: `latch config` prints it as `***`\n");
        }
        let _ = writeln!(out, "\n{}", d.meaning);
    }
    out
}

/// `text` as inline code, whatever backticks it holds.
fn code(text: &str) -> String {
    match text.contains('`') {
        true => format!("`` {text} ``"),
        false => format!("`{text}`"),
    }
}

fn api() -> String {
    let (_, derived) = super::v1();
    let doc = super::contract::document(derived, true, true);
    let mut out = format!(
        "{GENERATED}\n\n# HTTP API\n\nEvery operation and every schema of the API, from the OpenAPI \
         document latch serves at `/openapi.json` (shown here as it is once a token is \
         required, with rate limits on). Request and answer bodies are JSON; errors are \
         `{{\"code\", \"error\"}}`.\n\n## Operations\n\n| method | path | what |\n|---|---|---|\n"
    );
    let empty = serde_json::Map::new();
    let paths = doc["paths"].as_object().unwrap_or(&empty);
    let ops: Vec<(&str, &str, &Value)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .into_iter()
                .flatten()
                .filter(|(m, _)| matches!(m.as_str(), "get" | "post" | "put" | "patch" | "delete"))
                .map(move |(m, op)| (m.as_str(), path.as_str(), op))
        })
        .collect();
    for (method, path, op) in &ops {
        let title = format!("{} {path}", method.to_uppercase());
        let _ = writeln!(
            out,
            "| [{}](#{}) | `{path}` | {} |",
            method.to_uppercase(),
            heading_id(&title),
            one_line(op["summary"].as_str().unwrap_or(""))
        );
    }
    for (method, path, op) in &ops {
        // The path as code: mdBook reads a heading's trailing `{…}` as its attributes.
        let _ = write!(out, "\n### {} `{path}`\n\n", method.to_uppercase());
        for key in ["summary", "description"] {
            if let Some(t) = op[key].as_str().filter(|t| !t.is_empty()) {
                let _ = write!(out, "{t}\n\n");
            }
        }
        if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
            out.push_str("| parameter | in | required | type | bounds | meaning |\n");
            out.push_str("|---|---|---|---|---|---|\n");
            for p in params {
                let schema = &p["schema"];
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} | {} | {} |",
                    p["name"].as_str().unwrap_or(""),
                    p["in"].as_str().unwrap_or(""),
                    yes(p["required"].as_bool()),
                    type_of(schema),
                    bounds(schema),
                    one_line(p["description"].as_str().unwrap_or(""))
                );
            }
            out.push('\n');
        }
        if let Some(content) = op["requestBody"]["content"].as_object() {
            for (media, body) in content {
                let _ = write!(
                    out,
                    "Request body (`{media}`): {}\n\n",
                    type_of(&body["schema"])
                );
            }
        }
        if let Some(responses) = op["responses"].as_object() {
            out.push_str("| answer | meaning | body |\n|---|---|---|\n");
            for (status, r) in responses {
                let body = r["content"]
                    .as_object()
                    .and_then(|c| c.values().next())
                    .map(|m| type_of(&m["schema"]))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "| {status} | {} | {body} |",
                    one_line(r["description"].as_str().unwrap_or(""))
                );
            }
        }
    }
    out.push_str("\n## Schemas\n");
    if let Some(schemas) = doc["components"]["schemas"].as_object() {
        for (name, schema) in schemas {
            let _ = write!(out, "\n### {name}\n\n");
            if let Some(t) = schema["description"].as_str() {
                let _ = write!(out, "{t}\n\n");
            }
            out.push_str(&fields(schema));
        }
    }
    out
}

/// A schema's fields as a table, or what it is when it has none.
fn fields(schema: &Value) -> String {
    let Some(props) = schema["properties"].as_object() else {
        return format!("{}{}\n", type_of(schema), with_bounds(schema));
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::from("| field | type | required | bounds | meaning |\n");
    out.push_str("|---|---|---|---|---|\n");
    for (name, p) in props {
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} | {} |",
            type_of(p),
            yes(Some(required.contains(&name.as_str()))),
            bounds(p),
            one_line(p["description"].as_str().unwrap_or(""))
        );
    }
    out
}

fn with_bounds(schema: &Value) -> String {
    match bounds(schema) {
        b if b.is_empty() => String::new(),
        b => format!(" ({b})"),
    }
}

fn yes(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        _ => "",
    }
}

/// What a schema is, in a few words, with links to named schemas.
fn type_of(s: &Value) -> String {
    if let Some(r) = s["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[{name}](#{})", heading_id(name));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = s[key].as_array() {
            let names: Vec<String> = alts.iter().map(type_of).collect();
            return names.join(" or ");
        }
    }
    if let Some(all) = s["allOf"].as_array() {
        let names: Vec<String> = all.iter().map(type_of).collect();
        return names.join(" and ");
    }
    if let Some(c) = s.get("const") {
        return format!("`{c}`");
    }
    let kinds: Vec<String> = match &s["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => vec![],
    };
    let words: Vec<String> = kinds
        .iter()
        .map(|k| match k.as_str() {
            "array" => format!("array of {}", type_of(&s["items"])),
            "string" => match s["format"].as_str() {
                Some(f) => format!("string ({f})"),
                None => "string".into(),
            },
            "object" if s["properties"].is_object() => {
                let names: Vec<String> = s["properties"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(n, _)| format!("`{n}`"))
                    .collect();
                format!("object {{{}}}", names.join(", "))
            }
            other => other.to_string(),
        })
        .collect();
    match words.is_empty() {
        true => "any".into(),
        false => words.join(" or "),
    }
}

/// A schema's bounds: range, length, pattern, values, default.
fn bounds(s: &Value) -> String {
    let mut parts = Vec::new();
    let num = |k: &str| s.get(k).filter(|v| v.is_number()).map(Value::to_string);
    match (num("minimum"), num("maximum")) {
        (Some(lo), Some(hi)) => parts.push(format!("{lo} to {hi}")),
        (Some(lo), None) => parts.push(format!("≥ {lo}")),
        (None, Some(hi)) => parts.push(format!("≤ {hi}")),
        _ => {}
    }
    if let Some(v) = num("exclusiveMinimum") {
        parts.push(format!("> {v}"));
    }
    if let Some(v) = num("exclusiveMaximum") {
        parts.push(format!("< {v}"));
    }
    match (num("minLength"), num("maxLength")) {
        (Some(lo), Some(hi)) => parts.push(format!("{lo} to {hi} characters")),
        (Some(lo), None) => parts.push(format!("at least {lo} characters")),
        (None, Some(hi)) => parts.push(format!("at most {hi} characters")),
        _ => {}
    }
    match (num("minItems"), num("maxItems")) {
        (Some(lo), Some(hi)) => parts.push(format!("{lo} to {hi} items")),
        (Some(lo), None) => parts.push(format!("at least {lo} items")),
        (None, Some(hi)) => parts.push(format!("at most {hi} items")),
        _ => {}
    }
    if let Some(p) = s["pattern"].as_str() {
        parts.push(format!("pattern {}", code(p)));
    }
    if let Some(e) = s["enum"].as_array() {
        let vs: Vec<String> = e.iter().map(|v| format!("`{v}`")).collect();
        parts.push(format!("one of {}", vs.join(", ")));
    }
    if let Some(d) = s.get("default") {
        parts.push(format!("default `{d}`"));
    }
    // The items' own bounds, for an array of plain values.
    if s["items"].is_object() && s["items"]["$ref"].is_null() {
        let inner = bounds(&s["items"]);
        if !inner.is_empty() {
            parts.push(format!("each {inner}"));
        }
    }
    one_line(&parts.join("; "))
}

/// `text` fit for a table cell: one line, its pipes escaped.
fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn events() -> String {
    let mut out = format!(
        "{GENERATED}\n\n# Notification bodies\n\nEvery body latch sends to a receiver — as a \
         webhook's JSON body, an MQTT message or an AMQP message — with its JSON Schema (draft \
         2020-12) and an example. `GET /v1/event-types` serves the same, and the OpenAPI \
         document's `webhooks` holds the same schemas. Every object in a schema lists all its \
         fields (`additionalProperties: false`), and latch's tests validate every body they \
         receive against its schema.\n\n| type | what it tells |\n|---|---|\n"
    );
    for t in catalog() {
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | {} |",
            t.kind,
            heading_id(t.kind),
            one_line(t.description)
        );
    }
    for t in catalog() {
        let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON");
        let _ = write!(
            out,
            "\n## {}\n\n{}\n\nExample:\n\n```json\n{}\n```\n\n<details><summary>Schema</summary>\n\n\
             ```json\n{}\n```\n\n</details>\n",
            t.kind,
            t.description,
            pretty(&t.example),
            pretty(&t.schema)
        );
    }
    out
}

fn metrics() -> String {
    let mut out = format!(
        "{GENERATED}\n\n# Metrics\n\nEvery metric family latch records, in Prometheus' text \
         format at `/metrics` (open, like `/healthz`).\n\n\
         | family | kind | labels | meaning |\n|---|---|---|---|\n"
    );
    for f in ALL {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let labels: Vec<String> = f.labels.iter().map(|l| format!("`{l}`")).collect();
        let _ = writeln!(
            out,
            "| `{}` | {kind} | {} | {} |",
            f.name,
            labels.join(", "),
            one_line(f.help)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_book_s_reference_is_what_the_code_generates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference");
        let bless = std::env::var_os("LATCH_BLESS").is_some();
        let mut stale = Vec::new();
        for (name, text) in pages() {
            let path = dir.join(name);
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(name);
            }
        }
        assert!(
            stale.is_empty(),
            "docs/src/reference/{stale:?} differ from what the code generates; \
             `LATCH_BLESS=1 cargo test --lib api::reference` writes them"
        );
    }

    #[test]
    fn headings_get_mdbook_s_ids() {
        assert_eq!(heading_id("site_grace"), "site_grace");
        assert_eq!(heading_id("sensor.state_changed"), "sensorstate_changed");
        assert_eq!(heading_id("GET /v1/sensors/{id}"), "get-v1sensorsid");
        assert_eq!(heading_id("GET `/v1/sensors/{id}`"), "get-v1sensorsid");
        assert_eq!(heading_id("SensorCreate"), "sensorcreate");
    }

    #[test]
    fn the_reference_names_what_a_newcomer_looks_for() {
        let pages = pages();
        let page = |n: &str| &pages.iter().find(|(p, _)| *p == n).unwrap().1;
        assert!(page("settings.md").contains("\n## site_grace\n"));
        assert!(page("settings.md").contains("- Bounds: `0s` to `1h`"));
        assert!(page("api.md").contains("### POST `/v1/sensors`\n"));
        assert!(page("events.md").contains("\n## sensor.connection_lost\n"));
        assert!(page("metrics.md").contains("`latch_readings_accepted_total`"));
    }
}
