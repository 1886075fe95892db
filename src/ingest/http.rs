//! HTTP ingest: the body of `POST /v1/readings` in, what became of each reading out. The
//! route itself is the API's (`api::readings`): it maps these errors to statuses
//! and documents the wire types below in the OpenAPI document.

use serde::Serialize;
use utoipa::ToSchema;

use super::{Error, Ingest};
use crate::domain::{Millis, Reading, Rejection, Source, reading};
use crate::store::idempotency;
use crate::store::{Idempotency, Taken};

/// Most readings one request may carry.
pub const MAX_READINGS_PER_REQUEST: usize = 10_000;

/// Largest body of `POST /v1/readings`: room for 10,000 readings written generously, so
/// that an array over the count limit is answered for its count (422) rather than its size.
pub const MAX_READINGS_BODY_BYTES: usize = 16 * 1024 * 1024;

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
    /// Battery charge in percent; absent: the sensor keeps the last one reported.
    #[schema(minimum = 0, maximum = 100)]
    battery: Option<u8>,
    /// The tamper switch; absent: as last reported.
    tamper: Option<bool>,
    /// A fault code (1–32 of `a-z`, `0-9`, `_`), or `null` for none; absent: as last
    /// reported.
    #[schema(pattern = "^[a-z0-9_]{1,32}$", nullable)]
    fault: Option<String>,
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

impl Outcome {
    /// The status `POST /v1/readings` answers with.
    pub fn status(self) -> u16 {
        match self {
            Outcome::Stored => 202,
            Outcome::Refused => 422,
            Outcome::NotStored => 503,
        }
    }
}

/// What came of a request sent with an `Idempotency-Key` ([`submit_idempotent`]).
pub enum Idempotent {
    /// It ran: `answer`, with `before` the positions a commit applied under the key earlier
    /// (counted in `accepted`, not sent again).
    Ran { answer: Accepted, before: Vec<u32> },
    /// Its first run's answer, kept.
    Answered { status: u16, body: String },
    /// Another request with the key is still running.
    Busy,
    /// The key was sent with another request.
    Mismatch,
}

/// [`submit`] under an `Idempotency-Key`: takes the key in `keys`, sends only the readings
/// no commit applied under it yet ([`submit_keyed`]), and keeps the answer for repeats when
/// it changed something and left nothing to send again (else releases the key, so a repeat
/// runs again). `fingerprint` says what makes a repeat the same request.
pub async fn submit_idempotent(
    ingest: &Ingest,
    keys: &dyn Idempotency,
    key: &str,
    fingerprint: String,
    items: Vec<Result<Reading, Rejection>>,
    received_at: Millis,
) -> Result<Idempotent, Error> {
    let now = ingest.now();
    let before = match idempotency::take(keys, key, fingerprint, now).await? {
        Taken::Fresh { applied } => applied,
        Taken::Answered { status, body } => return Ok(Idempotent::Answered { status, body }),
        Taken::Busy => return Ok(Idempotent::Busy),
        Taken::Mismatch => return Ok(Idempotent::Mismatch),
    };
    let result = submit_keyed(ingest, items, received_at, key.into(), &before).await;
    let kept = match &result {
        Ok(a) if a.outcome() == Outcome::Stored && !a.any_transient() => Some((
            Outcome::Stored.status(),
            serde_json::to_string(a).expect("an answer serializes"),
        )),
        _ => None,
    };
    idempotency::settle(keys, key, kept).await;
    Ok(Idempotent::Ran {
        answer: result?,
        before,
    })
}

impl Accepted {
    /// Whether some readings were refused only because they could not be stored now.
    pub fn any_transient(&self) -> bool {
        self.rejected.iter().any(|r| r.transient)
    }

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
    /// `ts_in_future`, `invalid_battery`, `invalid_tamper`, `invalid_fault`, `unknown_field`, `unknown_sensor`, `not_an_object`; or
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

/// [`submit`] for a request sent with an `Idempotency-Key`: the readings at `applied`
/// (positions a commit applied under the key before) are not sent again and count as
/// accepted; every commit of the others keeps their positions under `key`.
pub async fn submit_keyed(
    ingest: &Ingest,
    items: Vec<Result<Reading, Rejection>>,
    received_at: Millis,
    key: std::sync::Arc<str>,
    applied: &[u32],
) -> Result<Accepted, Error> {
    let mut rest = Vec::with_capacity(items.len());
    let mut positions = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let p = i as u32;
        if applied.binary_search(&p).is_err() {
            rest.push(item);
            positions.push(p);
        }
    }
    let done = applied.len();
    let keyed = crate::store::Keyed {
        key,
        positions: positions.clone(),
    };
    // Stamped again as they go to the engine: the key's step in the store took time, and
    // readings of other requests stamped meanwhile may be ahead of these in the engine's
    // queue. A shard's timers (a loss, a hold) fire up to the newest stamp it applied, so a
    // stamp older than one already applied would say these came before a timer that fired
    // without them (simulation seed 1476: a `state_held` for a door closed 0.9 s after it
    // opened). The device time of a reading sent without one stays the request's.
    let received_at = received_at.max(ingest.now());
    let report = if rest.is_empty() {
        super::Report::default()
    } else {
        ingest
            .submit_keyed(Source::Http, rest, received_at, keyed)
            .await?
    };
    Ok(answer(report, done, |i| positions[i] as usize))
}

/// Submits parsed readings; answers once the accepted ones are durable. `Err` when none
/// could be made so.
pub async fn submit(
    ingest: &Ingest,
    items: Vec<Result<Reading, Rejection>>,
    received_at: Millis,
) -> Result<Accepted, Error> {
    let report = ingest.submit(Source::Http, items, received_at).await?;
    Ok(answer(report, 0, |i| i))
}

/// The answer to a request from the engine's report: `before` readings accepted earlier,
/// and each rejected item at its position in the request.
fn answer(report: super::Report, before: usize, position: impl Fn(usize) -> usize) -> Accepted {
    let mut rejected: Vec<RejectedOut> = report
        .rejected
        .into_iter()
        .map(|(index, r)| RejectedOut {
            index: position(index),
            code: r.code.as_str().to_string(),
            error: r.message,
            transient: r.code.is_transient(),
        })
        .collect();
    rejected.sort_by_key(|r| r.index);
    Accepted {
        accepted: before + report.accepted,
        rejected,
    }
}
