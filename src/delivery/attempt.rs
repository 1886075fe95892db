//! What one attempt sends and what came of it: the notification's body (DESIGN §4), its
//! Standard Webhooks signatures, and the result every destination reports in the same
//! shape. Below both the HTTP sender and the broker publishers, which each build on it.

use std::time::Duration;

use serde::Serialize;

use super::guard;
use super::signing;
use crate::domain::outbox::outcome;
use crate::domain::{EventKind, Millis, Sendable, client::secret_key, time};

/// How a broker's refusal (a nack, an unroutable return, a refused login or publish)
/// starts an attempt's error, so the attempts metric can tell it from a lost connection.
pub const REFUSED: &str = "refused by the broker";

/// The JSON body a client receives.
#[derive(Serialize)]
struct Payload<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    occurred_at: String,
    sensor: SensorRef<'a>,
    data: Option<u8>,
    previous: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seen_at: Option<String>,
    /// `sensor.still_lost`: since when, and which reminder.
    #[serde(skip_serializing_if = "Option::is_none")]
    lost_since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reminder: Option<u32>,
    /// `sensor.state_changed`: readings a debounce window held back (0 without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    flips_suppressed: Option<u32>,
}

#[derive(Serialize)]
struct SensorRef<'a> {
    id: String,
    address: &'a str,
}

/// The body of a notification, as bytes to sign and send.
pub fn payload(s: &Sendable) -> Vec<u8> {
    let n = &s.notification;
    let p = Payload {
        id: &n.id,
        kind: n.kind.as_str(),
        occurred_at: time::format(n.occurred_at),
        sensor: SensorRef {
            id: n.sensor_id.to_string(),
            address: &s.address,
        },
        data: n.data.map(u8::from),
        previous: n.previous.map(u8::from),
        last_seen_at: n.last_seen_at.map(time::format),
        lost_since: n.detail.lost_since.map(time::format),
        reminder: n.detail.reminder,
        flips_suppressed: match n.kind {
            EventKind::StateChanged => Some(n.detail.flips_suppressed.unwrap_or(0)),
            _ => n.detail.flips_suppressed,
        },
    };
    serde_json::to_vec(&p).expect("payload serializes")
}

/// The body of a batch: `{"id", "type": "batch", "events": [...]}`, each event exactly
/// the body its notification would have had alone ([`payload`]).
pub fn batch_payload(id: &str, sends: &[Box<Sendable>]) -> Vec<u8> {
    let head = serde_json::to_vec(&serde_json::json!({"id": id, "type": "batch"}))
        .expect("a batch head serializes");
    // `{"id":…,"type":"batch"` then `,"events":[…]}`.
    let mut body = Vec::with_capacity(head.len() + 16 + 400 * sends.len());
    body.extend_from_slice(&head[..head.len() - 1]);
    body.extend_from_slice(b",\"events\":[");
    for (i, s) in sends.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&payload(s));
    }
    body.extend_from_slice(b"]}");
    body
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub at: Millis,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub duration: Duration,
    /// `Retry-After` of a 429 or 503 answer.
    pub retry_after: Option<Duration>,
}

impl AttemptResult {
    pub fn delivered(&self) -> bool {
        crate::domain::notification::delivered(self.status_code, self.error.as_deref())
    }

    /// Nothing answered: the attempt timed out or could not connect (not a refusal of the
    /// SSRF guard or of a broker, which are answers). Such an endpoint holds a request
    /// slot for as long as it lets it, so its client is sent one request at a time until
    /// it answers again ([`super::lanes`]).
    pub fn unanswered(&self) -> bool {
        self.status_code.is_none()
            && self
                .error
                .as_deref()
                .is_some_and(|e| !e.starts_with(guard::NOT_ALLOWED) && !e.starts_with(REFUSED))
    }

    /// `410 Gone`: the receiver asks never to be tried again.
    pub fn gone(&self) -> bool {
        self.status_code == Some(410)
    }

    /// The SSRF guard refused the destination: nothing was sent, and trying again cannot
    /// change that until the client's URL or the allow list does.
    pub fn not_allowed(&self) -> bool {
        self.status_code.is_none()
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(guard::NOT_ALLOWED))
    }

    /// The `outcome` label of the attempts metric.
    pub fn label(&self) -> &'static str {
        match self.status_code {
            Some(c) if (200..300).contains(&c) => outcome::DELIVERED,
            Some(_) => outcome::HTTP_ERROR,
            None if self.error.is_none() => outcome::DELIVERED,
            None if self.not_allowed() => outcome::NOT_ALLOWED,
            None if self
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(outcome::AUTH_FAILED)) =>
            {
                outcome::AUTH_FAILED
            }
            None if self
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(REFUSED)) =>
            {
                outcome::BROKER_REFUSED
            }
            None if self
                .error
                .as_deref()
                .is_some_and(|e| e.contains("timed out")) =>
            {
                outcome::TIMEOUT
            }
            None => outcome::CONNECTION_ERROR,
        }
    }
}

/// The `webhook-signature` value: the signature with the client's secret, then, while a
/// rotation's grace lasts, the one with the secret it replaced, space-separated as
/// Standard Webhooks specifies, so a receiver holding either key verifies the request.
pub fn signatures(
    secret: &str,
    previous: Option<&str>,
    id: &str,
    ts: i64,
    body: &[u8],
) -> Result<String, String> {
    let mut value = signing::sign(&secret_key(secret)?, id, ts, body);
    if let Some(old) = previous
        && let Ok(key) = secret_key(old)
    {
        value.push(' ');
        value.push_str(&signing::sign(&key, id, ts, body));
    }
    Ok(value)
}
