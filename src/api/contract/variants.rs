//! Schemas one Rust type cannot state for every operation that takes it, made from the
//! constrained ones so every bound is written once:
//!
//! - a client to create (`ClientCreate`): `ClientIn` without what only a replace takes
//!   (the read-only fields, secrets left out to be kept), so `auth` needs its secret and
//!   `tls` its certificate and key;
//! - the merge patches (`SensorPatch`, `ClientPatch` and theirs): each field as the
//!   replace body bounds it, with the patch's own `null` (clear) where it has one.

use serde_json::{Map, Value, json};

/// Fields a read shows and a replace ignores: not in a create body.
const READ_ONLY: [&str; 9] = [
    "id",
    "created_at",
    "previous_secret_expires_at",
    "disabled_at",
    "disabled_reason",
    "health",
    "subject",
    "expires_at",
    "ca_subject",
];

/// The secret each kind of `auth` needs on create, by `oneOf` position.
const AUTH_SECRETS: [&str; 3] = ["token", "password", "client_secret"];

pub(super) fn constrain(doc: &mut Value) {
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
        .expect("the document has schemas");
    create_variants(schemas);
    patch_fields(schemas, "SensorPatch", "SensorReplace");
    patch_fields(schemas, "ClientPatch", "ClientIn");
    // A header's `null` in a patch removes it.
    schemas["ClientPatch"]["properties"]["headers"]["additionalProperties"]["type"] =
        json!(["string", "null"]);
    patch_fields(schemas, "TlsPatch", "TlsIn");
    patch_fields(schemas, "BatchPatch", "BatchIo");
    let auth_fields = auth_fields(&schemas["AuthIn"]);
    if let Some(props) = schemas["AuthPatch"]["properties"].as_object_mut() {
        for (name, field) in props.iter_mut() {
            if let Some(bounds) = auth_fields.get(name) {
                *field = with_type_of(bounds, field);
            }
        }
    }
    let post = "/paths/~1v1~1clients/post/requestBody/content/application~1json/schema";
    *doc.pointer_mut(post).expect("POST /v1/clients has a body") =
        json!({"$ref": "#/components/schemas/ClientCreate"});
}

fn create_variants(schemas: &mut Map<String, Value>) {
    let mut tls = schemas["TlsIn"].clone();
    strip_read_only(&mut tls);
    for field in ["client_cert_pem", "client_key_pem"] {
        tls["properties"][field]["type"] = json!("string");
    }
    tls["required"] = json!(["client_cert_pem", "client_key_pem"]);
    schemas.insert("TlsCreate".into(), tls);

    let mut auth = schemas["AuthIn"].clone();
    for (i, secret) in AUTH_SECRETS.iter().enumerate() {
        let kind = &mut auth["oneOf"][i];
        kind["properties"][secret]["type"] = json!("string");
        if let Some(required) = kind["required"].as_array_mut() {
            required.push(json!(secret));
        }
    }
    schemas.insert("AuthCreate".into(), auth);

    let mut client = schemas["ClientIn"].clone();
    strip_read_only(&mut client);
    for (field, to) in [("tls", "TlsCreate"), ("auth", "AuthCreate")] {
        let refs = client["properties"][field]["oneOf"].as_array_mut();
        for r in refs.into_iter().flatten() {
            if r.get("$ref").is_some() {
                r["$ref"] = json!(format!("#/components/schemas/{to}"));
            }
        }
    }
    schemas.insert("ClientCreate".into(), client);
}

fn strip_read_only(schema: &mut Value) {
    if let Some(props) = schema["properties"].as_object_mut() {
        for f in READ_ONLY {
            props.remove(f);
        }
    }
}

/// Each field of the patch `patch` bounded as the same field of `full`, keeping the
/// patch's own nullability (a patch's `null` clears, where the full body may not take one).
/// A field whose schema is a reference or a choice (`auth`, `tls`, `batch`) keeps the
/// patch's own.
fn patch_fields(schemas: &mut Map<String, Value>, patch: &str, full: &str) {
    let full_props = schemas[full]["properties"].clone();
    let Some(props) = schemas[patch]["properties"].as_object_mut() else {
        return;
    };
    for (name, field) in props.iter_mut() {
        match full_props.get(name) {
            Some(bounds) if bounds.get("type").is_some() => *field = with_type_of(bounds, field),
            _ => {}
        }
    }
}

/// `bounds` with the `type` (and description) of `field`.
fn with_type_of(bounds: &Value, field: &Value) -> Value {
    let mut out = bounds.clone();
    for key in ["type", "description"] {
        match field.get(key) {
            Some(v) => out[key] = v.clone(),
            None => {
                if let Some(o) = out.as_object_mut() {
                    o.remove(key);
                }
            }
        }
    }
    out
}

/// Every field of the kinds of `auth`, bounded.
fn auth_fields(auth_in: &Value) -> Map<String, Value> {
    let mut fields = Map::new();
    for kind in auth_in["oneOf"].as_array().into_iter().flatten() {
        for (name, field) in kind["properties"].as_object().into_iter().flatten() {
            fields.entry(name.clone()).or_insert_with(|| field.clone());
        }
    }
    fields
}
