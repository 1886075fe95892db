//! The operator console (issue #18): a small single-page app served at `/ui/`, its files
//! embedded in the binary so there is nothing to install or build at run time. It talks
//! only to the public `/v1` API, with the same token rules as any other caller.

use axum::Router;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::AppState;
use super::error::ApiError;

/// The console's files: name, media type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "lib.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/lib.js"),
    ),
    (
        "fleet.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/fleet.js"),
    ),
    (
        "alarms.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/alarms.js"),
    ),
    (
        "sensors.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/sensors.js"),
    ),
    (
        "sites.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/sites.js"),
    ),
    (
        "silences.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/silences.js"),
    ),
    (
        "clients.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/clients.js"),
    ),
    (
        "notifications.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/notifications.js"),
    ),
    (
        "schedules.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/schedules.js"),
    ),
    (
        "audit.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/audit.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("ui/style.css"),
    ),
];

/// Same origin only: the console loads nothing from elsewhere and no page elsewhere may
/// frame it.
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(|| async { asset("index.html") }))
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>| async move { asset(&file) }),
        )
}

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, media, body)) => (
            [
                (header::CONTENT_TYPE, *media),
                (header::CONTENT_SECURITY_POLICY, CSP),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                // Small files, and a new binary must not be served the old console.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => ApiError::not_found("file").into_response(),
    }
}
