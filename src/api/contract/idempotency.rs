//! The `Idempotency-Key` header on the `POST`s that take it ([`crate::api::idempotency`]).

use serde_json::{Value, json};

use super::error_response;
use crate::api::idempotency::{KEYED, MAX_KEY_LEN};

pub(super) fn constrain(doc: &mut Value) {
    for path in KEYED {
        let Some(op) = doc.pointer_mut(&format!("/paths/{}/post", path.replace('/', "~1"))) else {
            panic!("the OpenAPI document has no POST {path}");
        };
        let header = json!({
            "name": "Idempotency-Key",
            "in": "header",
            "required": false,
            "description": "Makes a repeat safe: a request sent again with the same key, \
                method, path and body within 24 hours gets the first answer (with \
                `Idempotent-Replayed: true`) and applies nothing. Only an answer that \
                changed something is kept; a refused request's key is free again.",
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LEN,
                "pattern": "^[!-~]+$"},
        });
        match op.get_mut("parameters").and_then(Value::as_array_mut) {
            Some(ps) => ps.push(header),
            None => op["parameters"] = json!([header]),
        }
        let responses = op["responses"]
            .as_object_mut()
            .expect("every operation has responses");
        responses.entry("409").or_insert_with(|| {
            error_response(
                "`idempotency_key_in_use`: a request with this key is still being answered \
                 (`Retry-After`)",
            )
        });
        responses.entry("422").or_insert_with(|| {
            error_response("`idempotency_key_reused`: the key was sent with another request")
        });
    }
}
