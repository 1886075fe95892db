//! Node-to-node requests (`/internal/v1/…`): who may make them. Below every resource that
//! serves one (the cluster's forwarding and following, the rates and the stream a node
//! relays), so none of them imports another for it.

use axum::http::HeaderMap;

use super::AppState;
use super::error::ApiError;
use crate::cluster::SECRET_HEADER;

/// Refuses a node-to-node request without the cluster secret (or on a single node).
/// There is always a secret ([`crate::cluster::trust`]), whatever the API's tokens are.
pub(super) fn admit(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(c) = &st.app.cluster else {
        return Err(ApiError::not_found("route"));
    };
    let given = headers.get(SECRET_HEADER).and_then(|v| v.to_str().ok());
    if c.admits(given) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}
