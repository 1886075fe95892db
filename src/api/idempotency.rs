//! `Idempotency-Key` on `POST /v1/readings` and the `POST`s that create: a repeat of a
//! request (same method, path and body) within [`crate::store::KEY_TTL_MS`] gets the first answer and
//! applies nothing.
//!
//! A request takes its key in the store first ([`Idempotency::take_key`]). Readings are
//! exact even across a crash: every group commit that applies some of a keyed request's
//! readings keeps their positions under the key in its own transaction, so a repeat of a
//! request that never got its answer applies only what no commit did. A create keeps its
//! answer once it is made; a crash between the two lets a repeat run the create again,
//! which a client-chosen id refuses (409) and a generated one does not.
//!
//! Only an answer that changed something is kept (a 2xx): a request refused or not stored
//! changed nothing, so its key is released and a repeat runs it again.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::domain::{Millis, Reading, Rejection};
use crate::ingest::http::{Accepted, Idempotent};
use crate::store::Taken;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Set on an answer given again for a repeat.
pub const REPLAYED: &str = "idempotent-replayed";
/// Longest a key may be.
pub const MAX_KEY_LEN: usize = 255;

/// The `POST`s that create, which take a key through [`creates`].
const CREATES: [&str; 4] = ["/v1/sensors", "/v1/clients", "/v1/sites", "/v1/silences"];

/// Every `POST` that takes a key: [`CREATES`] and `/v1/readings` (its handler's).
pub const KEYED: [&str; 5] = [
    "/v1/readings",
    CREATES[0],
    CREATES[1],
    CREATES[2],
    CREATES[3],
];

/// The request's key, if it sent one: 1 to 255 visible ASCII characters.
pub fn key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            format!(
                "Idempotency-Key must be one value of 1 to {MAX_KEY_LEN} visible ASCII \
                 characters (a UUID, say)"
            ),
        )
    };
    let k = v.to_str().map_err(|_| bad())?;
    if values.next().is_some()
        || k.is_empty()
        || k.len() > MAX_KEY_LEN
        || !k.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad());
    }
    Ok(Some(k.to_string()))
}

/// What makes two requests the same request.
fn fingerprint(method: &Method, path: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(method.as_str());
    h.update(b" ");
    h.update(path);
    h.update(b"\n");
    h.update(body);
    hex::encode(h.finalize())
}

/// Takes `key` for a create: `Ok(())` to run it, else the answer to give now.
async fn take(st: &AppState, key: &str, fingerprint: String) -> Result<(), Response> {
    let taken = st
        .app
        .take_key(key, fingerprint)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    match taken {
        Taken::Fresh { .. } => Ok(()),
        Taken::Answered { status, body } => Err(replay(status, body)),
        Taken::Busy => Err(busy()),
        Taken::Mismatch => Err(mismatch()),
    }
}

fn busy() -> Response {
    let mut r = ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_key_in_use",
        "a request with this Idempotency-Key is still being answered; send it again in a \
         moment",
    )
    .into_response();
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

fn mismatch() -> Response {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
        "this Idempotency-Key was sent with another request (method, path or body); use a \
         new key for a new request",
    )
    .into_response()
}

fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(REPLAYED, HeaderValue::from_static("true"));
    r
}

/// Keeps a create's answer for the key's repeats, or releases the key.
async fn settle(st: &AppState, key: String, answer: Option<(u16, String)>) {
    st.app.settle_key(&key, answer).await;
}

/// `POST /v1/readings` with a key ([`http::submit_idempotent`]).
pub(super) async fn readings(
    st: &AppState,
    key: String,
    body: &[u8],
    items: Vec<Result<Reading, Rejection>>,
    received_at: Millis,
) -> Result<(StatusCode, Accepted), Response> {
    let fingerprint = fingerprint(&Method::POST, "/v1/readings", body);
    let ran = st
        .app
        .submit_keyed(&st.ingest, &key, fingerprint, items, received_at)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    match ran {
        Idempotent::Ran { answer, .. } => {
            let status = StatusCode::from_u16(answer.outcome().status())
                .expect("readings statuses are statuses");
            Ok((status, answer))
        }
        Idempotent::Answered { status, body } => Err(replay(status, body)),
        Idempotent::Busy => Err(busy()),
        Idempotent::Mismatch => Err(mismatch()),
    }
}

/// The `POST`s that create, with a key: the first answer (a 2xx) is kept and given to
/// every repeat; a refusal releases the key. A created client's signing secret is not
/// kept with the answer: a repeat reads it from the client.
pub(super) async fn creates(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !CREATES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let key = match key(req.headers()) {
        Ok(Some(k)) => k,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let bytes = match axum::body::to_bytes(body, super::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::payload_too_large(format!(
                "the body is larger than this endpoint takes ({} MiB)",
                super::MAX_BODY_BYTES >> 20
            ))
            .into_response();
        }
    };
    if let Err(answer) = take(&st, &key, fingerprint(&parts.method, &path, &bytes)).await {
        return with_secret(&st, &path, answer).await;
    }
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if !resp.status().is_success() {
        settle(&st, key, None).await;
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            settle(&st, key, None).await;
            return internal(e.to_string());
        }
    };
    settle(
        &st,
        key,
        Some((parts.status.as_u16(), without_secret(&bytes))),
    )
    .await;
    Response::from_parts(parts, Body::from(bytes))
}

fn internal(message: String) -> Response {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message).into_response()
}

/// The answer as kept: a client's signing secret left out (the store seals it, and a kept
/// answer would hold it in clear).
fn without_secret(body: &Bytes) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(mut v) => {
            if let Some(o) = v.as_object_mut() {
                o.remove("secret");
            }
            v.to_string()
        }
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

/// A kept answer of `POST /v1/clients` with the client's signing secret as it is now (a
/// deleted client's answer goes without it).
async fn with_secret(st: &AppState, path: &str, answer: Response) -> Response {
    if path != "/v1/clients" || answer.headers().get(REPLAYED).is_none() {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return internal("a kept answer could not be read".into());
    };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let id = v.get("id").and_then(|i| i.as_str()).map(str::to_string);
    if let Some(id) = id
        && let Ok(Some(client)) = st.app.client(id).await
        && let Some(o) = v.as_object_mut()
    {
        o.insert("secret".into(), serde_json::Value::String(client.secret));
    }
    Response::from_parts(parts, Body::from(v.to_string()))
}
