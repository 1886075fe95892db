//! `PATCH` on sensors and clients as JSON merge patch (RFC 7396): the resource as `GET`
//! shows it, the patch merged in, then the replace that body makes — `PUT`'s checks and
//! answer. A field left out is kept, `null` clears it, and a secret (shown redacted or not
//! at all) is kept unless given. Sites take the same patches in `sites.rs`: their fields
//! are flat, so a merge is field by field.
//!
//! One deviation: an `auth` whose `type` changes is taken whole, not merged into the old
//! one, whose fields the new type does not have (RFC 7396 would keep them, and the merged
//! object would be refused). Two patches at once on one resource: the last wins, as with
//! `PUT`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::clients::{ClientIn, ClientOut, client_out};
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody, is_json, parse_sensor_id};
use super::sensors::{SensorOut, SensorReplace, sensor_out};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(patch_sensor))
        .routes(routes!(patch_client))
}

/// A merge patch: a JSON object, as `application/merge-patch+json` (or `application/json`).
pub struct MergePatch(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for MergePatch {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // `application/merge-patch+json` is one of the `+json` types.
        if !is_json(req.headers()) {
            return Err(ApiError::unsupported_media_type());
        }
        let bytes = Bytes::from_request(req, state).await?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(patch)) => Ok(Self(patch)),
            Ok(_) => Err(ApiError::invalid(
                "a merge patch must be a JSON object: the fields to change, null to clear one",
            )),
            Err(e) => Err(ApiError::bad_request(format!("malformed JSON: {e}"))),
        }
    }
}

/// `shown` with `patch` merged in, read as the replace body `T`. The patch is first read
/// as `P`, the patch's own schema, so a field no resource has, or of the wrong type, is
/// refused even where merging it would change nothing (`{"typo": null}`). 422 for either.
pub(super) fn merged<P: DeserializeOwned, T: DeserializeOwned>(
    shown: impl serde::Serialize,
    patch: MergePatch,
) -> ApiResult<T> {
    let patch = Value::Object(patch.0);
    serde_json::from_value::<P>(patch.clone())
        .map_err(|e| ApiError::invalid(format!("the patch: {e}")))?;
    // A shown resource is plain data: it always makes a JSON value.
    let mut doc = serde_json::to_value(shown).unwrap_or(Value::Null);
    if let (Some(Value::Object(new)), Some(Value::Object(old))) =
        (patch.get("auth"), doc.get("auth"))
        && new.get("type").is_some_and(|t| Some(t) != old.get("type"))
    {
        doc["auth"] = Value::Null;
    }
    json_patch::merge(&mut doc, &patch);
    serde_json::from_value(doc).map_err(|e| ApiError::invalid(format!("after the patch: {e}")))
}

/// The fields of a sensor a patch may change; each left out is kept, `null` clears it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The document's schema: the patch is merged as JSON.
pub struct SensorPatch {
    /// Its own id when given (409 otherwise).
    id: Option<String>,
    #[schema(nullable = false)]
    address: Option<String>,
    /// `null`: the service default.
    #[schema(minimum = 1, maximum = 2592000, nullable)]
    heartbeat_timeout_s: Option<Option<u32>>,
    /// `null`: the service default.
    #[schema(minimum = 0, maximum = 86400, nullable)]
    debounce_s: Option<Option<u32>>,
    /// `null`: in no site.
    #[schema(nullable)]
    site_id: Option<Option<String>>,
    /// `null`: the default, 20.
    #[schema(minimum = 0, maximum = 100, nullable)]
    battery_low_pct: Option<Option<u32>>,
    /// Merged: `{"1": "ajar"}` changes one label and keeps the other, `null` removes one
    /// (or all, given for `labels`).
    #[schema(nullable)]
    labels: Option<Option<crate::domain::sensor::Labels>>,
    /// The whole list (a list is replaced, not merged); `null` or `[]`: none.
    #[schema(nullable)]
    hold_alarms: Option<Option<Vec<crate::domain::hold::HoldAlarm>>>,
    /// Merged: `{"changes": 8}` keeps the window; `null`: never flapping.
    #[schema(nullable)]
    flap: Option<Option<FlapPatch>>,
    /// Merged: `{"when": "inside"}` keeps the schedule and state; `null`: not armed.
    #[schema(nullable)]
    armed: Option<Option<ArmedPatch>>,
}

/// A change to a sensor's arming.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct ArmedPatch {
    schedule_id: Option<String>,
    #[schema(minimum = 0, maximum = 1)]
    data: Option<u8>,
    when: Option<crate::domain::armed::When>,
}

/// A change to a sensor's flap.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct FlapPatch {
    #[schema(minimum = 2, maximum = 100)]
    changes: Option<u32>,
    #[schema(minimum = 10, maximum = 3600)]
    window_s: Option<u32>,
}

/// Change some of a sensor's fields (JSON merge patch, RFC 7396): those left out are
/// kept, `null` clears one (`site_id: null` takes it out of its site). Checked and
/// answered as `PUT` of the sensor with the patch applied.
#[utoipa::path(patch, path = "/v1/sensors/{id}", tag = "sensors", params(("id" = String, Path)),
    request_body(content = SensorPatch, content_type = "application/merge-patch+json"),
    responses((status = 200, body = SensorOut), (status = 404, body = ErrorBody),
        (status = 409, description = "an id in the patch differs from the path", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn patch_sensor(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    patch: MergePatch,
) -> ApiResult<ApiJson<SensorOut>> {
    let id = parse_sensor_id(&id)?;
    let view = st
        .app
        .sensor(id)
        .await?
        .ok_or_else(|| ApiError::not_found("sensor"))?;
    let body: SensorReplace = merged::<SensorPatch, _>(sensor_out(view), patch)?;
    super::sensors::replace(&st, id, body).await.map(ApiJson)
}

/// The fields of a client a patch may change; each left out is kept, `null` clears it.
/// Objects merge: `headers: {"X-Key": "v"}` sets one header and keeps the others,
/// `auth: {"token": "…"}` changes only the token.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The patch's schema, read to check it: it is merged as JSON.
pub struct ClientPatch {
    /// Its own id when given (409 otherwise).
    id: Option<String>,
    #[schema(nullable = false)]
    name: Option<String>,
    #[schema(nullable = false)]
    url: Option<String>,
    secret: Option<String>,
    #[schema(minimum = 1, maximum = 10000, nullable)]
    rate_limit: Option<Option<u32>>,
    #[schema(nullable)]
    events: Option<Option<Vec<String>>>,
    #[schema(nullable)]
    batch: Option<Option<BatchPatch>>,
    /// A header `null` removes it.
    #[schema(nullable)]
    headers: Option<Option<BTreeMap<String, Option<String>>>>,
    #[schema(nullable)]
    auth: Option<Option<AuthPatch>>,
    #[schema(nullable)]
    tls: Option<Option<TlsPatch>>,
    /// Merged: `{"after_s": 600}` keeps `to`; `null`: nobody is next.
    #[schema(nullable)]
    escalation: Option<Option<EscalationPatch>>,
}

/// A change to a client's escalation.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct EscalationPatch {
    #[schema(minimum = 1, maximum = 604800)]
    after_s: Option<u32>,
    to: Option<String>,
}

/// A change to a client's batching.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BatchPatch {
    #[schema(minimum = 1, maximum = 1000)]
    max_events: Option<u32>,
    #[schema(minimum = 0, maximum = 10000)]
    max_wait_ms: Option<u32>,
}

/// How latch authenticates to the receiver: a `type`, and the fields of that type
/// (`auth` in the client) to change. Another `type` than the client's replaces its `auth`
/// whole, so its secret must be given then.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct AuthPatch {
    #[serde(rename = "type")]
    #[schema(rename = "type", nullable = false)]
    kind: Option<AuthType>,
    token: Option<String>,
    #[schema(nullable = false)]
    username: Option<String>,
    password: Option<String>,
    #[schema(nullable = false)]
    token_url: Option<String>,
    #[schema(nullable = false)]
    client_id: Option<String>,
    client_secret: Option<String>,
    #[schema(nullable)]
    scope: Option<Option<String>>,
    #[schema(nullable)]
    audience: Option<Option<String>>,
}

/// The kinds of `auth`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthType {
    Bearer,
    Basic,
    Oauth2ClientCredentials,
}

/// A change to a client's certificate (`tls` in the client).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct TlsPatch {
    #[schema(min_length = 1)]
    client_cert_pem: Option<String>,
    #[schema(min_length = 1)]
    client_key_pem: Option<String>,
    #[schema(min_length = 1, nullable)]
    ca_pem: Option<Option<String>>,
}

/// Change some of a client's fields (JSON merge patch, RFC 7396): those left out are kept,
/// `null` clears one. Checked and answered as `PUT` of the client with the patch applied:
/// a `url` on another origin needs `headers` and `auth` given again.
#[utoipa::path(patch, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    request_body(content = ClientPatch, content_type = "application/merge-patch+json"),
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody),
        (status = 409, description = "an id in the patch differs from the path", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn patch_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    patch: MergePatch,
) -> ApiResult<ApiJson<ClientOut>> {
    let current = super::clients::existing(&st, id).await?;
    // Its URL in full, without its signing secret (left out, so kept).
    let shown = client_out(current.clone(), false, true, st.app.now());
    let body: ClientIn = merged::<ClientPatch, _>(shown, patch)?;
    super::clients::replace(&st, current, body)
        .await
        .map(ApiJson)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(v: Value) -> MergePatch {
        MergePatch(v.as_object().unwrap().clone())
    }

    #[test]
    fn left_out_kept_null_cleared_objects_merged() {
        let shown = json!({"a": 1, "b": 2, "h": {"x": "1", "y": "2"}});
        let out: Value =
            merged::<Value, _>(shown, patch(json!({"b": null, "h": {"y": null, "z": "3"}})))
                .unwrap();
        assert_eq!(out, json!({"a": 1, "h": {"x": "1", "z": "3"}}));
    }

    #[test]
    fn an_auth_of_another_type_is_taken_whole() {
        let shown = json!({"auth": {"type": "basic", "username": "u"}});
        let out: Value = merged::<Value, _>(
            shown.clone(),
            patch(json!({"auth": {"type": "bearer", "token": "t"}})),
        )
        .unwrap();
        assert_eq!(out, json!({"auth": {"type": "bearer", "token": "t"}}));
        let same: Value =
            merged::<Value, _>(shown, patch(json!({"auth": {"password": "p"}}))).unwrap();
        assert_eq!(
            same,
            json!({"auth": {"type": "basic", "username": "u", "password": "p"}})
        );
    }

    #[test]
    fn a_field_no_client_has_is_refused_even_as_null() {
        for bad in [
            json!({"": null}),
            json!({"auth": {"tokn": "t"}}),
            json!({"rate_limit": "9"}),
        ] {
            assert!(
                merged::<ClientPatch, Value>(json!({}), patch(bad.clone())).is_err(),
                "{bad}"
            );
        }
        let fine =
            json!({"auth": {"token": "t"}, "headers": {"X-A": null}, "tls": {"ca_pem": null}});
        assert!(merged::<ClientPatch, Value>(json!({}), patch(fine)).is_ok());
    }
}
