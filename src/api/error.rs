//! The API's one error type: every failure becomes `{"error": {"code", "message"}}` with a
//! fitting status. Server-side causes are logged and answered with a generic message.

use axum::Json;
use axum::extract::FromRequest;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
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

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }
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
            store::Error::Backend(cause) => {
                tracing::error!(error = %cause, "Store failed while serving a request.");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the store is unavailable; try again",
                )
            }
            store::Error::Sink(cause) => history::Error::ClickHouse(cause).into(),
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
        tracing::warn!(error = %e, "Readings not accepted.");
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
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send JSON with `Content-Type: application/json`",
            ),
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

/// `Json` whose rejections are contract errors.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        ApiError::bad_request(format!("invalid query: {}", r.body_text()))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(format!("invalid path: {}", r.body_text()))
    }
}

/// `Query` whose rejections are contract errors.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

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
