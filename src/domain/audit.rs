//! The audit trail: one record of every change made through the API — who (which token),
//! when, the request, and the resource before and after, with secrets redacted. The store
//! writes a record in the transaction of the change it tells of, so a change is never
//! without its record (`store::audit`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Millis;

/// The token a change was made with: `None` in a [`Record`] when the API is open (no token
/// set or made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRef {
    pub id: String,
    pub name: String,
}

/// One change, as the API saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub at: Millis,
    pub token: Option<TokenRef>,
    /// `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The request's path, `/v1/…`.
    pub path: String,
    /// What changed, as a path below `/v1` that names it: `sensors/door1`,
    /// `clients/c1/sensors/door1`, `alarms/01J…/ack`. A create's names the new id.
    pub resource: String,
    /// The resource as a `GET` read it just before (secrets redacted); `None` for a create.
    pub before: Option<Value>,
    /// What the request made of it (secrets redacted): the body of a create or a `PUT`, the
    /// merged resource of a `PATCH`, the body of an action; `None` for a delete.
    pub after: Option<Value>,
}

impl Record {
    /// The record of a create whose id the store chose: `resource` names the collection
    /// (`silences`) until the id is known, then `silences/{id}`; `after` gets the id too.
    pub fn created(mut self, id: &str) -> Self {
        if !self.resource.contains('/') {
            self.resource = format!("{}/{id}", self.resource);
        }
        if let Some(Value::Object(after)) = &mut self.after {
            after
                .entry("id")
                .or_insert_with(|| Value::String(id.to_string()));
        }
        self
    }
}

impl Record {
    /// The record with `after.{field}` set to `n`: what an action did (a replay's count).
    pub fn counted(mut self, field: &str, n: usize) -> Self {
        match &mut self.after {
            Some(Value::Object(after)) => {
                after.insert(field.to_string(), n.into());
            }
            after => *after = Some(serde_json::json!({ field: n })),
        }
        self
    }
}

/// A record as the store keeps it: ids grow with every record, so they order the trail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub id: i64,
    #[serde(flatten)]
    pub record: Record,
}

/// Field names whose values are secrets wherever they appear in a resource or a request:
/// a client's signing secret, its receiver auth, its TLS key, a token's secret.
const SECRET_FIELDS: &[&str] = &[
    "secret",
    "previous_secret",
    "token",
    "password",
    "client_secret",
    "client_key_pem",
];

/// What a redacted value reads as (the API's own word for a header's value).
pub const REDACTED: &str = "[redacted]";

/// Replaces every secret in `v` by [`REDACTED`]: the values of [`SECRET_FIELDS`] and of a
/// client's `headers` (which carry API keys), and the password of a broker `url`
/// (`mqtt://user:pw@host/…`, masked as a client read shows it). A `null` stays `null`: it
/// says "none set".
pub fn redact(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if SECRET_FIELDS.contains(&k.as_str()) && !val.is_null() && !val.is_object() {
                    *val = Value::String(REDACTED.into());
                } else if k == "url"
                    && let Value::String(url) = val
                {
                    *url = super::destination::redact(url);
                } else if k == "headers"
                    && let Value::Object(headers) = val
                {
                    for h in headers.values_mut() {
                        *h = Value::String(REDACTED.into());
                    }
                } else {
                    redact(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redact_hides_secrets_at_any_depth_and_keeps_the_rest() {
        let mut v = json!({
            "id": "c1", "secret": "whsec_x", "url": "http://h/",
            "headers": {"X-Api-Key": "k1"},
            "auth": {"type": "basic", "username": "u", "password": "p"},
            "tls": {"client_cert_pem": "CERT", "client_key_pem": "KEY"},
            "list": [{"token": "t"}], "previous_secret": null,
            "broker": {"url": "mqtt://door:s3cret@127.0.0.1:1883/doors"}
        });
        redact(&mut v);
        assert_eq!(
            v,
            json!({
                "id": "c1", "secret": REDACTED, "url": "http://h/",
                "headers": {"X-Api-Key": REDACTED},
                "auth": {"type": "basic", "username": "u", "password": REDACTED},
                "tls": {"client_cert_pem": "CERT", "client_key_pem": REDACTED},
                "list": [{"token": REDACTED}], "previous_secret": null,
                "broker": {"url": super::super::destination::redact(
                    "mqtt://door:s3cret@127.0.0.1:1883/doors")}
            })
        );
        assert!(!v.to_string().contains("s3cret"), "{v}");
    }

    #[test]
    fn a_create_names_the_id_the_store_chose() {
        let r = Record {
            at: 1,
            token: None,
            method: "POST".into(),
            path: "/v1/silences".into(),
            resource: "silences".into(),
            before: None,
            after: Some(json!({"comment": "x"})),
        }
        .created("s1");
        assert_eq!(r.resource, "silences/s1");
        assert_eq!(r.after, Some(json!({"comment": "x", "id": "s1"})));
        // A resource that names its id already keeps it.
        let again = r.clone().created("other");
        assert_eq!(again.resource, "silences/s1");
    }
}
