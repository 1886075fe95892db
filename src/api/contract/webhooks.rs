//! The document's `webhooks` (OpenAPI 3.1): one entry per type of body latch sends, with
//! the catalog's schema and example ([`crate::delivery::catalog`]). utoipa 5 has no
//! `webhooks` in its model, so the object is written here into the served document.

use serde_json::{Map, Value, json};

use crate::delivery::catalog::catalog;

pub(super) fn add(doc: &mut Value) {
    let header = |name: &str, what: &str| {
        json!({"name": name, "in": "header", "required": true, "description": what,
               "schema": {"type": "string"}})
    };
    let headers = [
        header(
            "webhook-id",
            "The notification's id (a batch's id for a batch): the same on every attempt, so a receiver can drop repeats.",
        ),
        header(
            "webhook-timestamp",
            "Unix seconds when the attempt was signed.",
        ),
        header(
            "webhook-signature",
            "`v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` with the client's secret; two, space-separated, while a rotated-out secret still signs.",
        ),
    ];
    let mut hooks = Map::new();
    for t in catalog() {
        let op = json!({
            "operationId": format!("webhook_{}", t.kind.replace('.', "_")),
            "summary": t.description,
            "description": "POSTed to a client's URL, or published to its MQTT topic or AMQP \
                exchange with the same headers as user properties or AMQP headers.",
            "security": [],
            "parameters": headers,
            "requestBody": {
                "required": true,
                "content": {"application/json": {"schema": t.schema, "example": t.example}},
            },
            "responses": {
                "2XX": {"description": "Delivered: not sent again."},
                "410": {"description": "Gone: not retried."},
                "default": {"description": "Any other answer, or none within the delivery timeout: retried later (after `Retry-After` of a 429 or 503)."},
            },
        });
        hooks.insert(t.kind.to_string(), json!({"post": op}));
    }
    if let Some(o) = doc.as_object_mut() {
        o.insert("webhooks".into(), Value::Object(hooks));
    }
}
