//! The outbox as the dispatcher and the store pass it between them: what is pending, what
//! a claim answered, what an attempt came to. Plain data; the rules over it are in
//! [`super::policy`].

use std::sync::Arc;

use super::client::Batch;
use super::notification::{Attempt, EventKind, Notification, Status};
use super::sensor::SensorId;
use super::time::Millis;

/// How an attempt ended, as the attempts metric labels it (`outcome`).
pub mod outcome {
    /// A 2xx answer.
    pub const DELIVERED: &str = "delivered";
    /// Any other answer.
    pub const HTTP_ERROR: &str = "http_error";
    /// A broker destination refused the publish (a nack, a return, a refused login).
    pub const BROKER_REFUSED: &str = "broker_refused";
    /// No answer within the delivery timeout.
    pub const TIMEOUT: &str = "timeout";
    /// No connection, or one cut off.
    pub const CONNECTION_ERROR: &str = "connection_error";
    /// The SSRF guard refused the destination (also the start of the attempt's error).
    pub const NOT_ALLOWED: &str = "destination_not_allowed";
    /// The receiver's OAuth2 token could not be had from its token endpoint (also the
    /// start of the attempt's error).
    pub const AUTH_FAILED: &str = "auth_failed";
    /// Every outcome, for the metric's series at start.
    pub const ALL: [&str; 6] = [
        DELIVERED,
        HTTP_ERROR,
        TIMEOUT,
        CONNECTION_ERROR,
        NOT_ALLOWED,
        AUTH_FAILED,
    ];
}

/// What the dispatcher needs of a pending notification to schedule it.
#[derive(Debug, Clone, PartialEq)]
pub struct NotificationRef {
    pub id: String,
    pub seq: i64,
    pub client_id: String,
    pub sensor_id: SensorId,
    pub kind: EventKind,
    pub due_at: Millis,
    pub attempts: u32,
    /// The batch it waits to be sent again in (its client batches, and a batch of it
    /// failed).
    pub batch_id: Option<String>,
}

impl NotificationRef {
    /// The dispatcher's view of a stored notification: due at its next attempt, or at once
    /// if it never had one.
    pub fn of(n: &Notification) -> Self {
        Self {
            id: n.id.clone(),
            seq: n.seq,
            client_id: n.client_id.clone(),
            sensor_id: n.sensor_id,
            kind: n.kind,
            due_at: n.next_attempt_at.unwrap_or(n.created_at),
            attempts: n.attempts,
            batch_id: n.batch_id.clone(),
        }
    }
}

/// A claimed notification with what sending it needs, read from the registry now.
#[derive(Clone, PartialEq)]
pub struct Sendable {
    pub notification: Notification,
    pub url: String,
    pub secret: String,
    /// The secret a rotation replaced, while its grace lasts: the request carries both
    /// signatures.
    pub previous_secret: Option<String>,
    pub address: String,
    /// The sensor's labels, read from the registry at the claim like its address.
    pub labels: super::sensor::Labels,
    /// The client's `rate_limit`, so the dispatcher follows changes made on other nodes.
    pub rate_limit: Option<u32>,
    /// The client's batching, likewise.
    pub batch: Option<Batch>,
    /// The client's headers, authentication and certificate, as the claim read them.
    pub receiver: super::receiver::Receiver,
    /// Why a secret of the client could not be opened (damaged, or sealed under a key this
    /// node lacks): its attempt fails with this instead of being sent.
    pub unopened: Option<String>,
}

/// Neither secret nor a broker URL's password: a claim in a log or a failed assertion
/// leaks none.
impl std::fmt::Debug for Sendable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sendable")
            .field("notification", &self.notification)
            .field("url", &super::destination::redact(&self.url))
            .field("secret", &"[redacted]")
            .field("address", &self.address)
            .field("labels", &self.labels)
            .field("rate_limit", &self.rate_limit)
            .field("batch", &self.batch)
            .field("receiver", &self.receiver)
            .field("unopened", &self.unopened)
            .finish_non_exhaustive()
    }
}

/// A claim of a batch's heads (see `delivery::lanes::batches`). Every claim unmarks the
/// heads it leases (a new request of them begins; the batch is marked again when its
/// outcome is recorded); a batch's claim also unmarks those of its heads it does not lease
/// and the ones `left_out` of this request, so none of them is ever sent under its id
/// again: a request with a batch's id holds only notifications the previous request with
/// that id held.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimBatch {
    pub left_out: Vec<String>,
}

/// The answer of a claim for one notification.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Leased to the caller: send it.
    Send(Box<Sendable>),
    /// No longer pending (delivered, superseded, failed, or now cancelled because its client
    /// is gone or no longer owns the sensor).
    Done { id: String, status: Status },
    /// Leased by another node until then (or being claimed by one right now): its attempt
    /// may be in flight.
    Leased { id: String, until: Millis },
    /// Free, but not to be sent before `at`: older notifications of its lane are pending
    /// elsewhere, or its next attempt is not due yet. `unswept`: an older one is pending
    /// and no node holds it, most likely made by another node (a site round, a silence's
    /// end) and not yet found by a sweep here.
    Later {
        id: String,
        at: Millis,
        unswept: bool,
    },
    /// Its client is disabled: left pending and unleased until the client is enabled.
    Disabled { id: String },
}

impl Claim {
    /// The id of the notification claimed.
    pub fn id(&self) -> &str {
        match self {
            Claim::Send(s) => &s.notification.id,
            Claim::Done { id, .. }
            | Claim::Leased { id, .. }
            | Claim::Later { id, .. }
            | Claim::Disabled { id } => id,
        }
    }

    /// The id of a notification the claim left pending and did not lease to the caller.
    pub fn left_pending(&self) -> Option<&str> {
        match self {
            Claim::Leased { id, .. } | Claim::Later { id, .. } | Claim::Disabled { id } => Some(id),
            Claim::Send(_) | Claim::Done { .. } => None,
        }
    }
}

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Delivered,
    Retry { next_at: Millis },
    Failed,
    Superseded,
}

impl Verdict {
    /// When the next attempt is due: only a retry has one.
    pub fn next_at(self) -> Option<Millis> {
        match self {
            Verdict::Retry { next_at } => Some(next_at),
            _ => None,
        }
    }
}

/// An attempt and its verdict, recorded in batches.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub notification_id: String,
    /// Its client, whose health (and whether it is disabled) the attempt changes.
    pub client_id: String,
    /// The attempt made; `None` when the verdict needed none (superseded while waiting).
    pub attempt: Option<Attempt>,
    /// Attempts made including this one.
    pub attempts: u32,
    pub verdict: Verdict,
    /// The node that came to it: the store keeps another node's live lease rather than
    /// write over it ([`super::policy::recorded`]).
    pub node: Arc<str>,
    /// The batch the attempt was sent in; `None`: alone, or no attempt. A retry of it goes
    /// in that batch again, so the store keeps it with the notification.
    pub batch_id: Option<String>,
}
