//! The OpenAPI document as served at `/openapi.json`.
//!
//! utoipa derives operations and schemas from the handlers; this module adds what the derive
//! cannot see, so that a generic client (schemathesis, a generated SDK) can trust the
//! document: every constraint the validators enforce — written here from the very constants
//! they use, so code and document cannot drift —, the statuses every operation can answer,
//! security as it stands (an open API, no security; with a token, 401 and 403 everywhere),
//! 429 where a rate limit is set, links from the operations that create ids to the ones
//! that take them, and the `webhooks`: the bodies latch sends, from the event catalog.

use serde_json::{Map, Value, json};

use super::pagination::MAX_LIMIT;
use super::readings::MAX_READINGS_PER_REQUEST;
use super::sensors::{MAX_DEBOUNCE_S, MAX_TIMEOUT_S};
use crate::delivery::catalog::catalog;
use crate::delivery::destination::URL_PATTERN;
use crate::domain::EventKind;
use crate::domain::client::{NAME_MAX_CHARS, URL_MAX_CHARS};
use crate::domain::notification::CLIENT_TEST;
use crate::domain::sensor::{ADDRESS_MAX_CHARS, MAX_ID_LEN};

mod idempotency;
mod receivers;
mod sites;
mod variants;
mod webhooks;

/// A sensor id, as [`crate::domain::SensorId::parse`] accepts it.
fn sensor_id_pattern() -> String {
    format!("^[A-Za-z0-9]{{1,{MAX_ID_LEN}}}$")
}

/// Text that is not only white space (the validators trim before checking emptiness): one
/// character outside Rust's `char::is_whitespace`, spelled out because a schema's `\\s` is
/// ECMA-262's, which leaves out U+0085 and takes in U+FEFF.
const NOT_BLANK: &str = "[^\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]";

/// `whsec_` + canonical base64 of a 16 to 64 byte key (`domain::client::secret_key`):
/// 3g + r bytes are g groups of four and a tail of r + 1 characters padded with `=`.
fn secret_pattern() -> String {
    let g = "[A-Za-z0-9+/]{4}";
    // The unused low bits of the last character are zero in canonical base64.
    let one = "[A-Za-z0-9+/][AQgw]==";
    let two = "[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=";
    format!(
        "^whsec_(?:(?:{g}){{5}}(?:{one}|{two})|(?:{g}){{6,20}}(?:{one}|{two})?|(?:{g}){{21}}(?:{one})?)$"
    )
}

/// Builds the document for a service that does (or does not) require a bearer token, and
/// does (or does not) limit request rates.
pub fn document(
    derived: utoipa::openapi::OpenApi,
    token_required: bool,
    rate_limited: bool,
) -> Value {
    let mut doc = serde_json::to_value(derived).expect("the derived document is JSON");
    constrain_schemas(&mut doc);
    receivers::constrain(&mut doc);
    sites::constrain(&mut doc);
    variants::constrain(&mut doc);
    idempotency::constrain(&mut doc);
    constrain_parameters(&mut doc);
    readings_body(&mut doc);
    add_statuses(&mut doc, token_required, rate_limited);
    add_links(&mut doc);
    webhooks::add(&mut doc);
    if !token_required {
        if let Some(o) = doc.as_object_mut() {
            o.remove("security");
        }
        if let Some(schemes) = doc.pointer_mut("/components/securitySchemes") {
            *schemes = json!({});
        }
    }
    doc
}

/// Merges `patch` into the object at `pointer`; a missing pointer is a bug in this table.
fn merge(doc: &mut Value, pointer: &str, patch: Value) {
    let target = doc
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("the OpenAPI document has no {pointer}"));
    if let Value::Object(p) = patch {
        target.extend(p);
    }
}

fn constrain_schemas(doc: &mut Value) {
    let s = "/components/schemas";
    let id = json!({"pattern": sensor_id_pattern(), "minLength": 1, "maxLength": MAX_ID_LEN});
    let address = json!({"minLength": 1, "maxLength": ADDRESS_MAX_CHARS, "pattern": NOT_BLANK});
    let timeout = json!({"minimum": 1, "maximum": MAX_TIMEOUT_S});
    for schema in ["SensorCreate", "SensorReplace"] {
        merge(
            doc,
            &format!("{s}/{schema}/properties/address"),
            address.clone(),
        );
        merge(
            doc,
            &format!("{s}/{schema}/properties/heartbeat_timeout_s"),
            timeout.clone(),
        );
        merge(doc, &format!("{s}/{schema}/properties/id"), id.clone());
        merge(
            doc,
            &format!("{s}/{schema}/properties/debounce_s"),
            json!({"minimum": 0, "maximum": MAX_DEBOUNCE_S}),
        );
    }
    let types: Vec<&str> = EventKind::ALL
        .iter()
        .map(|k| k.as_str())
        .chain([CLIENT_TEST])
        .collect();
    merge(
        doc,
        &format!("{s}/ClientIn/properties/events"),
        json!({"items": {"type": "string", "enum": types}, "uniqueItems": true}),
    );
    let bodies: Vec<&str> = catalog().iter().map(|t| t.kind).collect();
    merge(
        doc,
        &format!("{s}/EventType/properties/type"),
        json!({ "enum": bodies }),
    );
    merge(
        doc,
        "/paths/~1v1~1event-types/get/responses/200/content/application~1json",
        json!({"example": super::event_types::example()}),
    );
    merge(
        doc,
        &format!("{s}/ClientIn/properties/name"),
        json!({"minLength": 1, "maxLength": NAME_MAX_CHARS, "pattern": NOT_BLANK}),
    );
    merge(
        doc,
        &format!("{s}/ClientIn/properties/url"),
        // No `format: uri`: a broker destination's `{sensor_id}` is not RFC 3986, and the
        // pattern says exactly what is taken.
        json!({"maxLength": URL_MAX_CHARS, "pattern": URL_PATTERN.as_str()}),
    );
    merge(
        doc,
        &format!("{s}/ClientIn/properties/secret"),
        json!({"pattern": secret_pattern()}),
    );
    merge(
        doc,
        &format!("{s}/RotateIn/properties/secret"),
        json!({"pattern": secret_pattern()}),
    );
    merge(
        doc,
        &format!("{s}/ReplayIn/properties/sensor_id"),
        id.clone(),
    );
    merge(
        doc,
        &format!("{s}/ReplayIn/properties/since"),
        json!({"format": "date-time"}),
    );
    merge(
        doc,
        &format!("{s}/ReadingIn/properties/sensor_id"),
        id.clone(),
    );
    merge(
        doc,
        &format!("{s}/ReadingIn/properties/data"),
        json!({"enum": [0, 1]}),
    );
    merge(
        doc,
        &format!("{s}/ReadingIn/properties/ts"),
        json!({"format": "date-time"}),
    );
    merge(
        doc,
        &format!("{s}/TokenIn/properties/name"),
        json!({"minLength": 1, "maxLength": NAME_MAX_CHARS, "pattern": NOT_BLANK}),
    );
    merge(
        doc,
        &format!("{s}/TokenIn/properties/scopes"),
        json!({"minItems": 1}),
    );
}

/// Query and path parameters: ranges, patterns, enums and formats per operation.
fn constrain_parameters(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, ops) in paths.iter_mut() {
        let Some(ops) = ops.as_object_mut() else {
            continue;
        };
        for op in ops.values_mut() {
            let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
                continue;
            };
            for p in params {
                let name = p["name"].as_str().unwrap_or_default().to_string();
                let sensor_path = path.starts_with("/v1/sensors/");
                let site_path = path.starts_with("/v1/sites/");
                let patch = match name.as_str() {
                    "limit" => json!({"minimum": 1, "maximum": MAX_LIMIT}),
                    "cursor" => match cursor_pattern(path) {
                        Some(pattern) => json!({ "pattern": pattern }),
                        None => continue,
                    },
                    "connection" => json!({"enum": ["online", "lost", "unknown"]}),
                    "status" => {
                        json!({"enum": ["pending", "delivered", "failed", "superseded", "cancelled", "silenced"]})
                    }
                    "from" | "to" => json!({"format": "date-time"}),
                    "order" => json!({"enum": ["asc", "desc"]}),
                    "q" => json!({"maxLength": super::MAX_SEARCH_CHARS}),
                    "type" => json!({"enum": EventKind::ALL.map(|k| k.as_str())}),
                    "sensor_id" => json!({"pattern": sensor_id_pattern()}),
                    "id" if sensor_path => json!({"pattern": sensor_id_pattern()}),
                    "id" if site_path => json!({"pattern": sites::site_id_pattern()}),
                    "state" if path == "/v1/sites" => json!({"enum": ["down", "up"]}),
                    "state" if path == "/v1/alarms" => {
                        json!({"enum": ["open", "acknowledged", "resolved"]})
                    }
                    "kind" if path == "/v1/alarms" => {
                        json!({"enum": crate::domain::alarm::AlarmKind::ALL.map(|k| k.as_str())})
                    }
                    "state" => json!({"enum": ["active", "pending", "ended"]}),
                    _ => continue,
                };
                if let (Some(schema), Value::Object(patch)) =
                    (p.get_mut("schema").and_then(Value::as_object_mut), patch)
                {
                    schema.extend(patch);
                }
            }
        }
    }
}

/// What a cursor of each list looks like: the key of the last item of the page before
/// (empty means the first page). See `pagination`. Lists keyed by an id take any string,
/// since any string has its place among ids.
fn cursor_pattern(path: &str) -> Option<&'static str> {
    if path.ends_with("/readings") || path.ends_with("/events") {
        Some("^(?:-?[0-9]{1,18}:[0-9]{1,18})?$")
    } else if path == "/v1/notifications" || path == "/v1/audit" {
        Some("^[0-9]{0,18}$")
    } else {
        None
    }
}

/// `POST /v1/readings` takes one reading or an array; each element is judged on its own and
/// a bad one is listed in `rejected` (a 202 while another was accepted, else a 422 with the
/// same body), so the array's items are any JSON value.
fn readings_body(doc: &mut Value) {
    let schema = json!({
        "oneOf": [
            {
                "type": "object",
                "description": "One reading (`ReadingIn`); if it is not a valid one it is \
                    listed in `rejected` with its reason, and the answer is 422."
            },
            {
                "type": "array",
                "maxItems": MAX_READINGS_PER_REQUEST,
                "items": {
                    "description": "A reading (`ReadingIn`); an element that is not one is \
                        listed in `rejected` with its reason, the others still apply (422 \
                        when none does)."
                }
            }
        ]
    });
    merge(
        doc,
        "/paths/~1v1~1readings/post/requestBody/content/application~1json",
        json!({ "schema": schema }),
    );
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

/// The statuses the shared layers answer on any operation: bad input (400), a body not
/// JSON (415) or too large (413), a missing token (401) or one without the scope (403),
/// past the rate limit (429), the store away (503).
fn add_statuses(doc: &mut Value, token_required: bool, rate_limited: bool) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for ops in paths.values_mut() {
        let Some(ops) = ops.as_object_mut() else {
            continue;
        };
        for op in ops.values_mut() {
            let has_body = op.get("requestBody").is_some();
            let has_query = op
                .get("parameters")
                .and_then(Value::as_array)
                .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            if has_query {
                // `api::query`: a name the operation does not list is refused, not ignored.
                responses.insert(
                    "400".to_string(),
                    error_response(
                        "malformed: a bad id, query value or JSON body; or a query parameter \
                         this operation does not list (`unknown_parameter`, naming it)",
                    ),
                );
            }
            let mut add = |code: &str, what: &str| {
                responses
                    .entry(code.to_string())
                    .or_insert_with(|| error_response(what));
            };
            add("400", "malformed: a bad id, query parameter or JSON body");
            add(
                "503",
                "the store is unavailable; nothing was changed, try again",
            );
            if token_required {
                add("401", "no valid `Authorization: Bearer <token>`");
                add("403", "the token's scopes do not allow this operation");
            }
            if rate_limited {
                add(
                    "429",
                    "past the rate limit; `Retry-After` says when to try again",
                );
            }
            if has_body {
                add("413", "the body is too large");
                add("415", "the body is not `application/json`");
            }
        }
    }
}

/// Links from the operations that make ids to those that use them.
fn add_links(doc: &mut Value) {
    let from_body = |param: &str, pointer: &str, ops: &[&str]| -> Value {
        let mut links = Map::new();
        for op in ops {
            links.insert(
                (*op).to_string(),
                json!({"operationId": op, "parameters": {param: format!("$response.body#{pointer}")}}),
            );
        }
        Value::Object(links)
    };
    let sensor_ops = [
        "get_sensor",
        "replace_sensor",
        "delete_sensor",
        "sensor_readings",
        "sensor_events",
        "sensor_clients",
    ];
    merge(
        doc,
        "/paths/~1v1~1sensors/post/responses/201",
        json!({"links": from_body("id", "/id", &sensor_ops)}),
    );
    let client_ops = [
        "get_client",
        "replace_client",
        "delete_client",
        "client_sensors",
        "link",
        "unlink",
        "rotate_secret",
        "enable_client",
        "test_client",
    ];
    merge(
        doc,
        "/paths/~1v1~1clients/post/responses/201",
        json!({"links": from_body("id", "/id", &client_ops)}),
    );
    merge(
        doc,
        "/paths/~1v1~1sites/post/responses/201",
        json!({"links": from_body("id", "/id", &["get_site", "update_site", "delete_site"])}),
    );
    merge(
        doc,
        "/paths/~1v1~1silences/post/responses/201",
        json!({"links": from_body("id", "/id", &["get_silence", "update_silence", "delete_silence"])}),
    );
    merge(
        doc,
        "/paths/~1v1~1tokens/post/responses/201",
        json!({"links": from_body("id", "/id", &["delete_token"])}),
    );
    merge(
        doc,
        "/paths/~1v1~1notifications/get/responses/200",
        json!({"links": from_body("id", "/items/0/id", &["get_notification", "retry_notification"])}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(token: bool) -> Value {
        let (_, derived) = super::super::v1();
        document(derived, token, false)
    }

    #[test]
    fn security_follows_the_configuration() {
        let open = doc(false);
        assert!(open.get("security").is_none());
        assert!(
            open.pointer("/paths/~1v1~1sensors/get/responses/401")
                .is_none()
        );
        let locked = doc(true);
        assert_eq!(locked["security"], json!([{"bearer": []}]));
        assert!(
            locked
                .pointer("/paths/~1v1~1sensors/get/responses/401")
                .is_some()
        );
        assert!(
            locked
                .pointer("/paths/~1v1~1readings/post/responses/403")
                .is_some()
        );
    }

    #[test]
    fn rate_limits_add_429() {
        let (_, derived) = super::super::v1();
        assert!(
            doc(true)
                .pointer("/paths/~1v1~1readings/post/responses/429")
                .is_none()
        );
        let limited = document(derived, false, true);
        for (path, ops) in limited["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                assert!(op["responses"].get("429").is_some(), "{method} {path}");
            }
        }
    }

    #[test]
    fn every_operation_documents_the_shared_statuses() {
        let d = doc(true);
        for (path, ops) in d["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                for code in ["400", "401", "503"] {
                    assert!(
                        op["responses"].get(code).is_some(),
                        "{method} {path} {code}"
                    );
                }
                if op.get("requestBody").is_some() {
                    assert!(op["responses"].get("415").is_some(), "{method} {path}");
                }
            }
        }
    }

    fn matches(pattern: &str, text: &str) -> bool {
        regex::Regex::new(pattern).unwrap().is_match(text)
    }

    #[test]
    fn secret_pattern_matches_what_the_code_accepts() {
        use base64::Engine as _;
        let re = secret_pattern();
        for len in 12..=68usize {
            for seed in 0..4 {
                let key: Vec<u8> = (0..len)
                    .map(|i| (i * 37 + len + seed * 101) as u8)
                    .collect();
                let secret = format!(
                    "whsec_{}",
                    base64::engine::general_purpose::STANDARD.encode(&key)
                );
                let accepted = crate::domain::client::secret_key(&secret).is_ok();
                assert_eq!(matches(&re, &secret), accepted, "{len} bytes: {secret}");
            }
        }
        // Non-canonical tails decode nowhere and match nothing.
        assert!(!matches(&re, "whsec_AAAAAAAAAAAAAAAAAAAAAB=="));
        assert!(crate::domain::client::secret_key("whsec_AAAAAAAAAAAAAAAAAAAAAB==").is_err());
    }

    #[test]
    fn url_pattern_is_what_the_code_accepts() {
        let ok = [
            "https://example.com/hooks/latch",
            "http://a/",
            "HTTP://x1.y-2.com:8080/a/b_c~d.e?x=1&y=/z",
            "https://example.com",
            "http://127.0.0.1:9000/hook",
            "http://localhost:65535",
        ];
        let bad = [
            "ftp://a.com/",
            "http://1234/",
            "http://-a.com/",
            "http://a.com:0/",
            "http://a.com:65536/",
            "https://rp4ahkjd.info*",
            "http://256.1.1.1/",
            "http://[::1]/",
            "http://a b/",
        ];
        for u in ok {
            assert!(matches(&URL_PATTERN, u), "{u}");
            assert!(crate::delivery::destination::validate_url(u).is_ok(), "{u}");
            assert!(reqwest::Url::parse(u).is_ok(), "{u}");
        }
        for u in bad {
            assert!(!matches(&URL_PATTERN, u), "{u}");
            assert!(
                crate::delivery::destination::validate_url(u).is_err(),
                "{u}"
            );
        }
    }

    #[test]
    fn not_blank_is_what_trimming_leaves() {
        let re = regex::Regex::new(NOT_BLANK).unwrap();
        for c in (0..0x3100u32)
            .chain([0xFEFF, 0x1F600])
            .filter_map(char::from_u32)
        {
            assert_eq!(
                re.is_match(&c.to_string()),
                !c.is_whitespace(),
                "U+{:04X}",
                c as u32
            );
        }
    }

    #[test]
    fn sensor_id_pattern_matches_what_the_code_accepts() {
        let re = sensor_id_pattern();
        for id in [
            "a",
            "0xA",
            "0123456789aBcDeF",
            "",
            "0123456789aBcDeF0",
            "a b",
            "ä",
        ] {
            assert_eq!(
                matches(&re, id),
                crate::domain::SensorId::parse(id).is_ok(),
                "{id:?}"
            );
        }
    }
}
