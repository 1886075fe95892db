//! The HTTP API v1 (DESIGN §5): one module per resource, each with its `router()`, merged
//! here with health, metrics, the OpenAPI document, bearer-token auth with scopes and the
//! request rate limit.
//!
//! Auth: the API is open while no `LATCH_API_TOKEN` is set and no token exists; otherwise
//! every `/v1` request needs the bootstrap token (admin) or a token from `/v1/tokens`,
//! whose scopes must allow it. Health, readiness, metrics and the document stay open.

pub mod alarms;
pub mod audit;
pub mod book;
pub mod clients;
pub mod cluster;
pub mod contract;
pub mod error;
pub mod event_types;
pub mod fleet;
pub mod idempotency;
pub mod limits;
mod linger;
pub mod notifications;
pub mod pagination;
mod patch;
mod peers;
pub mod query;
pub mod rates;
pub mod readings;
pub mod receivers;
pub mod reference;
pub mod schedules;
pub mod sensors;
pub mod silences;
pub mod sites;
pub mod stream;
pub mod tokens;
pub mod ui;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

use crate::config::Config;
use crate::ingest::{Ingest, Sources};
use crate::telemetry::events::{AuthRefused, Emit};
use crate::telemetry::families;
use error::ApiError;

/// Largest request body but for readings (`readings::MAX_READINGS_BODY_BYTES`).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// The store, engine, dispatcher, history and cluster, and the sequences across them:
    /// every read and change a handler makes goes through it.
    pub app: crate::app::App,
    /// This node's membership in a cluster, for the node-to-node transport alone: the
    /// cluster secret a peer's request shows, and the peers a fleet-wide answer (rates,
    /// the event stream) asks.
    pub peers: Option<Arc<crate::cluster::Membership>>,
    pub ingest: Ingest,
    /// Broker sources and whether each is consuming.
    pub sources: Sources,
    pub metrics: PrometheusHandle,
    /// False once shutdown began: load balancers should stop sending.
    pub accepting: Arc<AtomicBool>,
    /// The API tokens in memory, read on every request.
    pub tokens: tokens::Tokens,
    /// The per-caller request limit, when `rate_limit` is set.
    pub limiter: Option<Arc<limits::Limiter>>,
    /// Failed authentications by peer address, when `auth_failure_limit` is set: `/v1`'s
    /// and `/internal`'s, so neither a token nor the cluster secret can be guessed fast.
    pub failures: Option<Arc<limits::Limiter<std::net::IpAddr>>>,
    /// This node's id and the address other nodes reach it at (`GET /v1/cluster`).
    pub node: String,
    pub address: String,
    /// Events as they are committed here, for `GET /v1/stream`.
    pub live: tokio::sync::broadcast::Sender<crate::domain::Live>,
    /// Cancelled when shutdown begins: ends the event streams, which the HTTP server's
    /// graceful stop would otherwise wait for forever.
    pub streams_stop: tokio_util::sync::CancellationToken,
    /// The last hour of this node's activity (`GET /v1/fleet/rates`).
    pub recent: Arc<crate::telemetry::recent::Recent>,
}

impl AppState {
    /// Whether `/v1` requires a token now: a bootstrap token is set, or tokens exist.
    pub fn auth_required(&self) -> bool {
        self.config.api_token.is_some() || self.tokens.any()
    }
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
        .merge(event_types::router())
        .merge(readings::router())
        .merge(notifications::router())
        .merge(tokens::router())
        .merge(cluster::router())
        .merge(fleet::router())
        .merge(rates::router())
        .merge(stream::router())
        .merge(sites::router())
        .merge(silences::router())
        .merge(alarms::router())
        .merge(audit::router())
        .merge(schedules::router())
        .merge(patch::router())
        .split_for_parts()
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    let (v1, derived) = v1();
    let bare = Arc::new(query::Bare::from_document(&derived));
    // Whether a token is required changes when the first token is made or the last one
    // deleted, so both documents are ready and each request gets the one true now.
    // A locked API answers 429 to an address that failed too often, whatever the rate.
    let limited = state.config.rate_limit.is_some();
    let throttled = limited || state.config.auth_failure_limit.is_some();
    let open_doc = Arc::new(contract::document(derived.clone(), false, limited));
    let locked_doc = Arc::new(contract::document(derived, true, throttled));
    // The audit layer reads a resource before it changes through these same routes.
    let trail = audit::Trail {
        app: state.app.clone(),
        reader: self::v1().0.with_state(state.clone()),
    };
    let v1 = v1
        .layer(middleware::from_fn_with_state(trail, audit::trail))
        .layer(middleware::from_fn_with_state(bare, query::refuse_query))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            idempotency::creates,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    Router::new()
        .merge(v1)
        .merge(
            cluster::internal().layer(middleware::from_fn_with_state(state.clone(), peers::admit)),
        )
        .merge(ui::router())
        .merge(book::router())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(move |State(st): State<AppState>| {
                let doc = if st.auth_required() {
                    locked_doc.clone()
                } else {
                    open_doc.clone()
                };
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .fallback(|| async { ApiError::not_found("route") })
        // After every route: it is set on the routes there are.
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(linger::lingering))
        .with_state(state)
}

/// A path that exists called with a method it does not take: 405 in the JSON error format,
/// with axum's `Allow` header listing the methods it takes.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}: the Allow header lists what is",
            uri.path()
        ),
    )
}

/// Who is calling, as far as auth goes.
enum Caller {
    /// The API is open: no token is set or made.
    Anyone,
    /// `LATCH_API_TOKEN`: admin.
    Bootstrap,
    Token(tokens::Grant),
}

/// Whether the caller may see signing secrets: an open API, the bootstrap token or an
/// `admin` token. A `read` token reads clients without them.
#[derive(Clone, Copy, Debug)]
pub struct SeesSecrets(pub bool);

/// Auth, then the rate limit, then the scope: 429 from an address that failed too often,
/// 401 for a missing or unknown token, 429 past the caller's rate, 403 for what the
/// token's scopes do not allow.
async fn require_token(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let caller = match st.auth_required() {
        true => match authenticate(&st, peer(&req), || identify_by(&st, req.headers())) {
            Ok(caller) => caller,
            Err(refused) => return refused.into_response(),
        },
        false => Caller::Anyone,
    };
    if let Some(limiter) = &st.limiter {
        let key = match &caller {
            Caller::Anyone => limits::Key::Peer(peer(&req)),
            Caller::Bootstrap => limits::Key::Bootstrap,
            Caller::Token(grant) => limits::Key::Token(grant.id.clone()),
        };
        // Tokio's clock: a simulated run moves it.
        if let Err(wait) = limiter.check(key, tokio::time::Instant::now().into_std()) {
            families::HTTP_RATE_LIMIT
                .counter_with(&[("outcome", "limited")])
                .increment(1);
            return error::rate_limited(wait);
        }
        families::HTTP_RATE_LIMIT
            .counter_with(&[("outcome", "allowed")])
            .increment(1);
    }
    if let Caller::Token(grant) = &caller
        && !tokens::permits(&grant.scopes, req.method(), req.uri().path())
    {
        let scopes: Vec<&str> = grant.scopes.iter().map(|s| s.as_str()).collect();
        return ApiError::forbidden(format!(
            "this token's scopes ({}) do not allow {} {}",
            scopes.join(", "),
            req.method(),
            req.uri().path()
        ))
        .into_response();
    }
    let sees = match &caller {
        Caller::Anyone | Caller::Bootstrap => true,
        Caller::Token(grant) => grant.scopes.contains(&crate::domain::token::Scope::Admin),
    };
    req.extensions_mut().insert(SeesSecrets(sees));
    let who = match caller {
        Caller::Anyone => None,
        Caller::Bootstrap => Some(crate::domain::audit::TokenRef {
            id: "bootstrap".into(),
            name: "LATCH_API_TOKEN".into(),
        }),
        Caller::Token(grant) => Some(crate::domain::audit::TokenRef {
            id: grant.id,
            name: grant.name,
        }),
    };
    req.extensions_mut().insert(audit::Who(who));
    next.run(req).await
}

/// Runs `check` for a request from `peer` unless that address failed too often lately
/// (429, the check not even run, so a throttled guess learns nothing); a failure is
/// counted against the address and in `latch_http_auth_failures_total`. `/internal`'s
/// cluster secret goes through here too.
pub(crate) fn authenticate<T>(
    st: &AppState,
    peer: std::net::IpAddr,
    check: impl FnOnce() -> Result<T, AuthFailure>,
) -> Result<T, Refused> {
    // Tokio's clock: a simulated run moves it.
    let now = tokio::time::Instant::now().into_std();
    if let Some(failures) = &st.failures
        && let Err(wait) = failures.wait(&peer, now)
    {
        AuthRefused {
            reason: "throttled",
            peer: None,
        }
        .emit();
        return Err(Refused::Throttled(wait));
    }
    check().map_err(|failure| {
        if failure == AuthFailure::Unconfirmed {
            return Refused::Unconfirmed;
        }
        if let Some(failures) = &st.failures {
            let _ = failures.check(peer, now);
        }
        AuthRefused {
            reason: failure.reason(),
            peer: Some(peer),
        }
        .emit();
        Refused::Failed
    })
}

/// What [`authenticate`] answers instead of the request.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The address failed too often lately: 429 with `Retry-After` (this wait).
    Throttled(std::time::Duration),
    /// 401.
    Failed,
    /// 503: the token table could not be confirmed lately.
    Unconfirmed,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Throttled(wait) => error::rate_limited(wait),
            Refused::Failed => ApiError::unauthorized().into_response(),
            Refused::Unconfirmed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the API tokens could not be reloaded from the store lately, so this token \
                 may have been deleted; try again",
            )
            .into_response(),
        }
    }
}

/// Why a request was not authenticated, as `latch_http_auth_failures_total` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// No `Authorization: Bearer` header.
    MissingToken,
    /// A token that is neither the bootstrap token nor a token made (or no longer).
    UnknownToken,
    /// A node-to-node request without the cluster's secret.
    ClusterSecret,
    /// A token of the table, which this node could not reload for too long
    /// ([`tokens::CONFIRM_WITHIN`]): 503, neither counted nor throttled (it may be good).
    Unconfirmed,
}

impl AuthFailure {
    fn reason(self) -> &'static str {
        match self {
            AuthFailure::MissingToken => "missing_token",
            AuthFailure::UnknownToken => "unknown_token",
            AuthFailure::ClusterSecret => "cluster_secret",
            AuthFailure::Unconfirmed => "unconfirmed",
        }
    }
}

/// Whether the request whose headers were `headers` would be let through now: the same
/// auth and scope checks, for a request that lasts (the live stream) as the tokens change.
pub(crate) fn still_permitted(
    st: &AppState,
    headers: &axum::http::HeaderMap,
    method: &axum::http::Method,
    path: &str,
) -> bool {
    match identify_by(st, headers) {
        Ok(Caller::Anyone | Caller::Bootstrap) => true,
        Ok(Caller::Token(grant)) => tokens::permits(&grant.scopes, method, path),
        Err(_) => false,
    }
}

fn identify_by(st: &AppState, headers: &axum::http::HeaderMap) -> Result<Caller, AuthFailure> {
    if !st.auth_required() {
        return Ok(Caller::Anyone);
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or(AuthFailure::MissingToken)?;
    if let Some(bootstrap) = &st.config.api_token
        && crate::domain::token::constant_time_eq(given, bootstrap)
    {
        return Ok(Caller::Bootstrap);
    }
    match st.tokens.lookup(given) {
        tokens::Lookup::Known(grant) => Ok(Caller::Token(grant)),
        tokens::Lookup::Unknown => Err(AuthFailure::UnknownToken),
        tokens::Lookup::Unconfirmed => Err(AuthFailure::Unconfirmed),
    }
}

/// The peer's address; unspecified when served without connection info (never by `run`).
pub(crate) fn peer(req: &Request) -> std::net::IpAddr {
    req.extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |c| c.0.ip())
}

/// The token of an `Authorization` value; the scheme is case-insensitive (RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn readyz(State(st): State<AppState>) -> Response {
    if !st.accepting.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    if st.app.joining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "joining the cluster").into_response();
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
    match st.app.ping().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        // Not a secret, and what an operator must act on: named in the answer.
        Err(e) if e.is_full() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "storage full: the store's disk has no space; readings are refused until space is freed",
        )
            .into_response(),
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

/// Longest search text (`?q=`), in characters.
pub const MAX_SEARCH_CHARS: usize = 200;

/// A list's `?q=`: `None` when absent or holding nothing to search for (the whole list).
pub(crate) fn search(q: Option<&str>) -> Result<Option<crate::store::Search>, ApiError> {
    let Some(q) = q else { return Ok(None) };
    if q.chars().count() > MAX_SEARCH_CHARS {
        return Err(ApiError::bad_request(format!(
            "q must be at most {MAX_SEARCH_CHARS} characters"
        )));
    }
    Ok(crate::store::Search::parse(q))
}

/// An optional whole number; `30.0` counts as one, as JSON Schema's `integer` says (so a
/// generic client sending it is not refused).
pub(crate) fn whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u32>, D::Error> {
    use serde::Deserialize;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => Some(u),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    whole
        .and_then(|u| u32::try_from(u).ok())
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number, got {n}")))
}

/// A whole number that must be there ([`whole_number`]).
pub(crate) fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    whole_number(d)?.ok_or_else(|| serde::de::Error::custom("expected a whole number, got null"))
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
