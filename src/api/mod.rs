//! The HTTP API v1 (DESIGN §5): one module per resource, each with its `router()`, merged
//! here with health, metrics, the OpenAPI document and bearer-token auth.

pub mod clients;
pub mod contract;
pub mod error;
pub mod notifications;
pub mod pagination;
pub mod readings;
pub mod sensors;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

use crate::config::Config;
use crate::delivery::Dispatcher;
use crate::engine::Engine;
use crate::history::History;
use crate::ingest::{Ingest, Sources};
use crate::store::Store;
use error::ApiError;

/// Largest request body but for readings (`readings::MAX_READINGS_BODY_BYTES`).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub engine: Engine,
    pub ingest: Ingest,
    /// Broker sources and whether each is consuming.
    pub sources: Sources,
    pub dispatcher: Dispatcher,
    /// History reads: the store, or ClickHouse plus the store's spool.
    pub history: History,
    pub metrics: PrometheusHandle,
    /// False once shutdown began: load balancers should stop sending.
    pub accepting: Arc<AtomicBool>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "latch", description = "Binary sensor state changes, delivered reliably as webhooks."),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The v1 routes and the OpenAPI document utoipa derives for them.
pub(crate) fn v1() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(sensors::router())
        .merge(clients::router())
        .merge(readings::router())
        .merge(notifications::router())
        .split_for_parts()
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    let (v1, derived) = v1();
    let doc = Arc::new(contract::document(
        derived,
        state.config.api_token.is_some(),
    ));
    let v1 = v1
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    Router::new()
        .merge(v1)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .fallback(|| async { ApiError::not_found("route") })
        .with_state(state)
}

async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &st.config.api_token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The token of an `Authorization` value; the scheme is case-insensitive (RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares without an early exit, so the time taken tells nothing of the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn readyz(State(st): State<AppState>) -> Response {
    if !st.accepting.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    let down = st.sources.down();
    if !down.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("ingest paused: {} not connected", down.join(", ")),
        )
            .into_response();
    }
    // Open to anyone: the cause goes to the log, not to the answer.
    match st.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "Not ready: the store does not answer.");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
        }
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearerabc"), None);
    }
}
