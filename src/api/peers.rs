//! Node-to-node requests (`/internal/v1/…`): who may make them. One layer in front of
//! every resource that serves one (the cluster's forwarding and following, the rates and
//! the stream a node relays), so none of them can forget it, and so a request is judged by
//! its headers before its body — up to 16 MiB of forwarded readings — is read.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::{AppState, AuthFailure};
use crate::cluster::SECRET_HEADER;

/// Refuses a node-to-node request without the cluster secret (or on a single node), before
/// its body is read; failures count against the peer's address as failed logins do, so a
/// guesser is throttled ([`super::authenticate`]). There is always a secret
/// ([`crate::cluster::trust`]), whatever the API's tokens are.
pub(super) async fn admit(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(c) = &st.peers else {
        return ApiError::not_found("route").into_response();
    };
    let given = req
        .headers()
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok());
    let checked = super::authenticate(&st, super::peer(&req), || {
        c.admits(given)
            .then_some(())
            .ok_or(AuthFailure::ClusterSecret)
    });
    match checked {
        Ok(()) => next.run(req).await,
        Err(refused) => refused.into_response(),
    }
}
