//! `/v1/audit`: who changed what through the API, and the layer that makes each record.
//!
//! [`trail`] runs around every handler that changes something: it notes the token, the
//! request, the resource as a `GET` shows it just before (from the same routes, without
//! secrets) and what the request makes of it, then leaves the record waiting
//! ([`crate::store::audit::scope`]) for the store write that makes the change, which keeps
//! it in its own transaction. A request refused (4xx) or idempotently repeated makes none.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower::ServiceExt;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiResult, ErrorBody};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use super::readings::RangeParams;
use crate::domain::audit::{Entry, Record, TokenRef, redact};
use crate::domain::time;
use crate::store::AuditFilter;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_audit))
}

/// Who made a request, for its record: set by the auth layer (`None`: the API is open).
#[derive(Clone, Debug)]
pub(crate) struct Who(pub Option<TokenRef>);

/// The token of a record.
#[derive(Serialize, ToSchema)]
pub struct AuditToken {
    pub id: String,
    pub name: String,
}

/// One change made through the API.
#[derive(Serialize, ToSchema)]
pub struct AuditOut {
    pub id: String,
    /// When it was made (latch's clock).
    pub at: String,
    /// The token it was made with: its id and name (`bootstrap` for `LATCH_API_TOKEN`);
    /// `null` when the API is open.
    pub token: Option<AuditToken>,
    pub method: String,
    pub path: String,
    /// What changed, as a path below `/v1`: `sensors/door1`, `clients/c1/sensors/door1`,
    /// `alarms/{id}/ack`.
    pub resource: String,
    /// The resource as `GET` showed it just before; `null` for a create. Secrets redacted.
    #[schema(value_type = Option<Object>)]
    pub before: Option<Value>,
    /// What the request made of it: the body of a create, a `PUT` or an action, the merged
    /// resource of a `PATCH`; `null` for a delete. Secrets redacted.
    #[schema(value_type = Option<Object>)]
    pub after: Option<Value>,
}

fn audit_out(e: Entry) -> AuditOut {
    let r = e.record;
    AuditOut {
        id: e.id.to_string(),
        at: time::format(r.at),
        token: r.token.map(|t| AuditToken {
            id: t.id,
            name: t.name,
        }),
        method: r.method,
        path: r.path,
        resource: r.resource,
        before: r.before,
        after: r.after,
    }
}

/// `GET /v1/audit`'s filters beyond the time range: every one given must match.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Changes made with this token. No control characters.
    #[param(pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    pub token_id: Option<String>,
    /// A resource and what is below it: `sensors` (every sensor's changes),
    /// `sensors/door1`, `clients/c1`. No control characters.
    #[param(pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    pub resource: Option<String>,
}

impl Params for AuditParams {}

/// List the changes made through the API, newest first; the filters combine. Records are
/// kept as long as notifications (`retention_notifications`). Admin tokens only.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(PageParams, RangeParams, AuditParams),
    responses((status = 200, body = List<AuditOut>), (status = 400, body = ErrorBody)))]
async fn list_audit(
    State(st): State<AppState>,
    ApiQuery((page, range, filter)): ApiQuery<(PageParams, RangeParams, AuditParams)>,
) -> ApiResult<ApiJson<List<AuditOut>>> {
    for (name, v) in [
        ("token_id", &filter.token_id),
        ("resource", &filter.resource),
    ] {
        if v.as_deref()
            .is_some_and(|v| v.chars().any(char::is_control))
        {
            return Err(ApiError::bad_request(format!(
                "{name} must not hold control characters"
            )));
        }
    }
    let resource = filter
        .resource
        .map(|r| r.trim_matches('/').to_string())
        .filter(|r| !r.is_empty());
    let filter = AuditFilter {
        range: range.range()?,
        token_id: filter.token_id,
        resource,
    };
    let page = st.app.audit(filter, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, audit_out)))
}

/// What [`trail`] reads with: the v1 routes without the layers, to read a resource as a
/// `GET` shows it before it changes.
#[derive(Clone)]
pub(crate) struct Trail {
    pub app: crate::app::App,
    pub reader: axum::Router,
}

/// Requests that change nothing, though not a `GET`: readings (data, not a change of what
/// latch is told to do) and a client's test send. `segments`: the path below `/v1`.
fn changes_nothing(method: &Method, segments: &[String]) -> bool {
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
        || (*method == Method::POST && matches!(s[..], ["readings"] | ["clients", _, "test"]))
}

/// The path below `/v1`, a segment each, as the routes read them (percent-decoded: a
/// record names `sensors/door1` however the request spelled it).
fn segments_of(path: &str) -> Vec<String> {
    path.trim_start_matches("/v1/")
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect()
}

/// Makes the record of a change and leaves it for the store write that makes the change.
pub(crate) async fn trail(State(t): State<Trail>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segments = segments_of(&path);
    if changes_nothing(&method, &segments) {
        return next.run(req).await;
    }
    let token = req.extensions().get::<Who>().and_then(|w| w.0.clone());
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, super::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::payload_too_large(format!(
                "the body is larger than {} bytes",
                super::MAX_BODY_BYTES
            ))
            .into_response();
        }
    };
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    let before = match read_before(&t.reader, &method, &segments).await {
        Some(mut v) => {
            shown_settings(&mut v, segments.first().map(String::as_str));
            redact(&mut v);
            Some(v)
        }
        None => None,
    };
    let after = match method {
        Method::DELETE => None,
        Method::PATCH => match (&before, &body) {
            (Some(b), Some(patch)) => {
                let mut doc = b.clone();
                json_patch::merge(&mut doc, patch);
                Some(doc)
            }
            _ => body.clone(),
        },
        _ => body.clone(),
    }
    .map(|mut v| {
        redact(&mut v);
        v
    });
    let mut resource = segments.join("/");
    // A create names its id when the body gives it; otherwise the store names the id it
    // chose (`Record::created`).
    if method == Method::POST
        && segments.len() == 1
        && let Some(id) = body
            .as_ref()
            .and_then(|b| b.get("id"))
            .and_then(|i| i.as_str())
    {
        resource = format!("{resource}/{id}");
    }
    let record = Record {
        at: t.app.now(),
        token,
        method: method.to_string(),
        path: path.clone(),
        resource,
        before,
        after,
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    let (response, taken) = crate::store::audit::scope(record, next.run(req)).await;
    if response.status().is_success() && !taken {
        // A request that changed nothing (ending a silence already ended).
        tracing::debug!(%method, %path, "no change made, no audit record");
    }
    response
}

/// The resource a change acts on, as `GET` shows it without secrets, read just before the
/// handler runs (not in the change's transaction: a change racing this one may come
/// between): `/v1/{kind}/{id}` for a change of it or an action on it (`/ack`, `/retry`,
/// `/enable`), a token as the list shows it; none for a create or a link.
async fn read_before(reader: &axum::Router, method: &Method, segments: &[String]) -> Option<Value> {
    if segments.len() < 2 || (*method == Method::POST && segments.len() == 1) {
        return None;
    }
    if segments.len() == 4 && segments[2] == "sensors" {
        return None;
    }
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    // Tokens are read as a list only.
    if segments[0] == "tokens" {
        let list = read(reader, "/v1/tokens".into()).await?;
        return list["items"]
            .as_array()?
            .iter()
            .find(|t| t["id"] == segments[1].as_str())
            .cloned();
    }
    read(
        reader,
        format!("/v1/{}/{}", enc(&segments[0]), enc(&segments[1])),
    )
    .await
}

/// A `GET` of `uri` through the routes, as a caller that may not see secrets: its JSON
/// when it answers 200.
async fn read(reader: &axum::Router, uri: String) -> Option<Value> {
    let mut get = Request::get(uri).body(Body::empty()).ok()?;
    get.extensions_mut().insert(super::SeesSecrets(false));
    let answer = reader.clone().oneshot(get).await.ok()?;
    if answer.status() != StatusCode::OK {
        return None;
    }
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Keeps of a shown resource what a change can change: a sensor's, a site's or a
/// schedule's `status` and a client's `health` are the service's own reading of it, not
/// settings.
fn shown_settings(v: &mut Value, kind: Option<&str>) {
    let Value::Object(map) = v else { return };
    match kind {
        Some("sensors") | Some("sites") | Some("schedules") => {
            map.remove("status");
        }
        Some("clients") => {
            map.remove("health");
        }
        _ => {}
    }
}
