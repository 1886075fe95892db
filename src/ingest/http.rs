//! HTTP ingest: the body of `POST /v1/readings` in, what became of each reading out. The
//! route itself is the API's (`api::readings`): it maps these errors to statuses
//! and documents the wire types below in the OpenAPI document.

use serde::Serialize;
use utoipa::ToSchema;

use super::{Error, Ingest};
use crate::domain::{Millis, Reading, Rejection, reading};

/// Most readings one request may carry.
pub const MAX_READINGS_PER_REQUEST: usize = 10_000;

/// Largest body of `POST /v1/readings`: room for 10,000 readings written generously, so
/// that an array over the count limit is answered for its count (422) rather than its size.
pub const MAX_READINGS_BODY_BYTES: usize = 16 * 1024 * 1024;

const SOURCE: &str = "http";

/// A reading: `{"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00Z"}`.
/// Any other field refuses the reading (`unknown_field`).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Documents the wire format; parsing is by hand for per-field reasons.
pub struct ReadingIn {
    #[schema(example = "xa7v9Dfadr7H")]
    sensor_id: String,
    /// 0 or 1.
    data: u8,
    /// Device time, RFC 3339; the receive time when absent.
    ts: Option<String>,
}

/// What became of the posted readings.
#[derive(Serialize, ToSchema)]
pub struct Accepted {
    /// Readings whose effects are now durable.
    pub accepted: usize,
    pub rejected: Vec<RejectedOut>,
}

/// What a request came to as a whole: what its status says to a sender that reads
/// nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Some readings are durable (or the request held none).
    Stored,
    /// None is durable, and each was refused for what it is: sending it again changes
    /// nothing.
    Refused,
    /// None is durable, and some were refused only because their commit failed: send
    /// those again.
    NotStored,
}

impl Accepted {
    pub fn outcome(&self) -> Outcome {
        if self.accepted > 0 || self.rejected.is_empty() {
            Outcome::Stored
        } else if self.rejected.iter().any(|r| r.transient) {
            Outcome::NotStored
        } else {
            Outcome::Refused
        }
    }
}

/// A reading that was not applied, and why.
#[derive(Serialize, ToSchema)]
pub struct RejectedOut {
    /// Position in the posted array (0 for a single reading).
    pub index: usize,
    /// Machine-readable reason: `invalid_sensor_id`, `invalid_data`, `invalid_ts`,
    /// `ts_in_future`, `unknown_field`, `unknown_sensor`, `not_an_object`; or
    /// `store_unavailable`: valid but not stored (part of the request could not be
    /// committed), send it again; or `storage_full`: the same, because the store's disk is
    /// full.
    pub code: String,
    pub error: String,
    /// Valid but not stored (`store_unavailable`, `storage_full`).
    #[serde(skip)]
    transient: bool,
}

/// Parses a body of one reading or an array of them, each element on its own. `Err` only
/// for a body that is not readings at all, or carries too many.
pub fn parse(
    body: &[u8],
    now: Millis,
) -> Result<Vec<Result<Reading, Rejection>>, reading::BodyError> {
    reading::parse_many(body, now, MAX_READINGS_PER_REQUEST)
}

/// Submits parsed readings; answers once the accepted ones are durable. `Err` when none
/// could be made so.
pub async fn submit(
    ingest: &Ingest,
    items: Vec<Result<Reading, Rejection>>,
    received_at: Millis,
) -> Result<Accepted, Error> {
    let report = ingest.submit(SOURCE, items, received_at).await?;
    Ok(Accepted {
        accepted: report.accepted,
        rejected: report
            .rejected
            .into_iter()
            .map(|(index, r)| RejectedOut {
                index,
                code: r.code.as_str().to_string(),
                error: r.message,
                transient: r.code.is_transient(),
            })
            .collect(),
    })
}
