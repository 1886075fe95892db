//! The API's one error type: every failure becomes `{"error": {"code", "message"}}` with a
//! fitting status. Server-side causes are logged and answered with a generic message.

use axum::Json;
use axum::body::Bytes;
use axum::extract::FromRequest;
use axum::extract::Request;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::http::StatusCode;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{engine, history, ingest, store};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The error body of every failed request.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable: `bad_request`, `invalid`, `not_found`, `conflict`, …
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    /// The contract's answer to a body over the size limit.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// A body that is not declared as JSON.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send JSON with `Content-Type: application/json`",
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }

    /// A query parameter the operation does not take, named with those it takes
    /// (`super::query`).
    pub fn unknown_parameter(name: &str, known: &[String]) -> Self {
        let takes = if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        };
        Self::new(
            StatusCode::BAD_REQUEST,
            "unknown_parameter",
            format!("unknown query parameter `{name}`; this operation takes: {takes}"),
        )
    }

    /// A known token asking for what its scopes do not allow.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
}

/// The contract's 429: the error body and `Retry-After` in whole seconds (at least 1), when
/// the caller's bucket holds a request again.
pub fn rate_limited(wait: std::time::Duration) -> Response {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many requests; try again in {secs} s"),
    )
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::NotFound(what) => ApiError::not_found(what),
            store::Error::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            store::Error::BadCursor => ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_cursor",
                "cursor is not one this API returned",
            ),
            store::Error::Backend(cause) | store::Error::Indeterminate(cause) => {
                tracing::error!(error = %cause, "Store failed while serving a request.");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the store is unavailable; try again",
                )
            }
            store::Error::Full(cause) => {
                tracing::debug!(error = %cause, "Store refused a write: its disk is full.");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_full",
                    "the store's disk is full; try again once space is freed",
                )
            }
            store::Error::Sink(cause) => history::Error::ClickHouse(cause).into(),
            store::Error::Fenced(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the partition moved to another node; try again",
            ),
        }
    }
}

impl From<history::Error> for ApiError {
    fn from(e: history::Error) -> Self {
        match e {
            history::Error::Store(e) => e.into(),
            history::Error::ClickHouse(cause) => {
                tracing::error!(error = %cause, "ClickHouse failed while serving a request.");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "history_unavailable",
                    "the history store (ClickHouse) is unavailable; try again",
                )
            }
        }
    }
}

impl From<engine::Error> for ApiError {
    fn from(e: engine::Error) -> Self {
        if let engine::Error::StorageFull(_) = e {
            // The store logged the episode once; a line per request would flood the log.
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_full",
                "the store's disk is full: nothing was accepted; send the readings again once \
                 space is freed",
            );
        }
        tracing::warn!(error = %e, "Readings not accepted.");
        if let engine::Error::Unknown(_) = e {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the store could not say whether the readings were made durable (outcome \
                 unknown): they may have been; sending them again changes no state twice",
            );
        }
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "readings could not be made durable; nothing was accepted, send them again",
        )
    }
}

impl From<ingest::Error> for ApiError {
    fn from(e: ingest::Error) -> Self {
        match e {
            ingest::Error::Engine(e) => e.into(),
            ingest::Error::Store(e) => e.into(),
        }
    }
}

impl From<crate::app::Error> for ApiError {
    fn from(e: crate::app::Error) -> Self {
        match e {
            crate::app::Error::Store(e) => e.into(),
            crate::app::Error::Invalid(m) => ApiError::invalid(m),
            crate::app::Error::UnknownSchedule(m) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_schedule", m)
            }
            crate::app::Error::ScheduleInUse(m) => {
                ApiError::new(StatusCode::CONFLICT, "schedule_in_use", m)
            }
            crate::app::Error::Engine(e) => e.into(),
            crate::app::Error::History(e) => e.into(),
            crate::app::Error::Cluster(crate::cluster::Error::Store(e)) => e.into(),
            crate::app::Error::Cluster(other) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                other.to_string(),
            ),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonDataError(e) => ApiError::invalid(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => {
                ApiError::bad_request(format!("malformed JSON: {}", e.body_text()))
            }
            JsonRejection::MissingJsonContentType(_) => ApiError::unsupported_media_type(),
            JsonRejection::BytesRejection(e) => e.into(),
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(format!(
                "the body is larger than this endpoint takes ({} MiB for readings, {} MiB \
                 elsewhere)",
                crate::ingest::http::MAX_READINGS_BODY_BYTES >> 20,
                super::MAX_BODY_BYTES >> 20
            ))
        } else {
            ApiError::bad_request(r.body_text())
        }
    }
}

/// A JSON request body as raw bytes, for handlers that parse it themselves (readings):
/// the same content-type rule as [`ApiJson`], so no page in a browser can post one as a
/// `text/plain` form without a CORS preflight.
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::unsupported_media_type());
        }
        Ok(Self(Bytes::from_request(req, state).await?))
    }
}

/// `application/json` or any `application/*+json`, parameters (charset) allowed — the
/// types axum's `Json` accepts too.
pub(crate) fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub[sub.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// `Json` whose rejections are contract errors. Every body it takes is a JSON object:
/// serde would otherwise read an array as a struct's fields in order (`["a", "b"]` as
/// `{"id": "a", "address": "b"}`), which no schema allows.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(req, state).await?;
        if !value.is_object() {
            return Err(ApiError::invalid("the body must be a JSON object"));
        }
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("invalid body: {e}")))
    }
}

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(format!("invalid path: {}", r.body_text()))
    }
}

/// `Path` whose rejections are contract errors.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Parses a sensor id from a path or query, as a 400 with the reason when malformed.
pub fn parse_sensor_id(s: &str) -> ApiResult<crate::domain::SensorId> {
    crate::domain::SensorId::parse(s).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_sensor_id",
            format!("{e} (got {s:?})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        let ok = |v: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            is_json(&h)
        };
        assert!(ok("application/json"));
        assert!(ok("Application/JSON; charset=utf-8"));
        assert!(ok("application/vnd.latch+json"));
        assert!(!ok("text/plain"));
        assert!(!ok("application/x-www-form-urlencoded"));
        assert!(!ok("multipart/form-data; boundary=x"));
        assert!(!ok("application/jsonp"));
        assert!(!ok("+json"));
        assert!(!is_json(&axum::http::HeaderMap::new()));
    }
}
