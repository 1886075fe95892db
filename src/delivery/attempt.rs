//! What one attempt sends and what came of it: the notification's body (DESIGN §4), its
//! Standard Webhooks signatures, and the result every destination reports in the same
//! shape. Below both the HTTP sender and the broker publishers, which each build on it.

use std::time::Duration;

use serde::Serialize;

use super::signing;
use crate::domain::notification::{BATCH, CLIENT_TEST};
use crate::domain::outbox::outcome;
use crate::domain::sensor::Labels;
use crate::domain::{EventKind, Millis, Notification, Sendable, client::secret_key, hold, time};

/// How a broker's refusal (a nack, an unroutable return, a refused login or publish)
/// starts an attempt's error.
pub const REFUSED: &str = "refused by the broker";

/// The JSON body a client receives.
#[derive(Serialize)]
struct Payload<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    occurred_at: String,
    sensor: SensorRef<'a>,
    /// Absent (the outer `None`) for a battery, tamper or fault event, which is about no state.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Option<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<Option<u8>>,
    /// The sensor's label of `data` and of `previous`, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_label: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seen_at: Option<String>,
    /// `sensor.still_lost`: since when, and which reminder.
    #[serde(skip_serializing_if = "Option::is_none")]
    lost_since: Option<String>,
    /// `sensor.state_held`: since when the state held (and `reminder`, which reminder).
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    /// `sensor.state_held`, `sensor.state_held_cleared`: seconds the state held.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reminder: Option<u32>,
    /// `sensor.state_changed`: readings a debounce window held back (0 without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    flips_suppressed: Option<u32>,
    /// `sensor.battery_low`, `sensor.battery_ok`: the battery reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    battery: Option<u8>,
    /// `sensor.battery_low`: the threshold it fell to.
    #[serde(skip_serializing_if = "Option::is_none")]
    threshold: Option<u8>,
    /// `sensor.flapping`: the sensor's `flap` (`changes` is the threshold).
    #[serde(skip_serializing_if = "Option::is_none")]
    changes: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_s: Option<u32>,
    /// `sensor.fault`: the code.
    #[serde(skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
    /// `sensor.state_out_of_schedule`: the schedule (`{id, name}`), stored as its body.
    #[serde(skip_serializing_if = "Option::is_none")]
    schedule: Option<serde_json::Value>,
    /// The alarm it opens, reminds of or clears (`GET /v1/alarms/{id}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    alarm_id: Option<&'a str>,
}

#[derive(Serialize)]
struct SensorRef<'a> {
    id: String,
    address: &'a str,
}

/// The body of a notification, as bytes to sign and send.
pub fn payload(s: &Sendable) -> Vec<u8> {
    body(&s.notification, &s.address, &s.labels)
}

/// The body of notification `n` of a sensor at `address` with `labels` (a site's names
/// its own).
pub fn body(n: &Notification, address: &str, labels: &Labels) -> Vec<u8> {
    if let (true, Some(own)) = (n.kind.has_own_body(), &n.body) {
        return own_payload(
            &n.id,
            n.kind.as_str(),
            n.occurred_at,
            n.alarm_id.as_deref(),
            own,
        );
    }
    let p = Payload {
        id: &n.id,
        kind: n.kind.as_str(),
        occurred_at: time::format(n.occurred_at),
        sensor: SensorRef {
            id: n.sensor_id.to_string(),
            address,
        },
        data: (!n.kind.is_signal()).then_some(n.data.map(u8::from)),
        previous: (!n.kind.is_signal()).then_some(n.previous.map(u8::from)),
        label: n.data.and_then(|d| labels.of(d)),
        previous_label: n.previous.and_then(|d| labels.of(d)),
        // A connection's news only: a silence's end also stores it with the state change
        // that brings a client up to date, whose body has no such field.
        last_seen_at: n
            .last_seen_at
            .filter(|_| n.kind.is_connection())
            .map(time::format),
        // A hold's start travels in the same field as a loss's (`Detail::lost_since`).
        lost_since: n
            .detail
            .lost_since
            .filter(|_| !n.kind.is_hold())
            .map(time::format),
        since: n
            .detail
            .lost_since
            .filter(|_| n.kind == EventKind::StateHeld)
            .map(time::format),
        held_s: n
            .detail
            .lost_since
            .filter(|_| n.kind.is_hold())
            .map(|since| hold::held_s(since, n.occurred_at)),
        reminder: n.detail.reminder,
        flips_suppressed: match n.kind {
            EventKind::StateChanged => Some(n.detail.flips_suppressed.unwrap_or(0)),
            _ => n.detail.flips_suppressed,
        },
        battery: n.detail.battery,
        // A flapping's threshold travels in the same field as a battery's.
        threshold: n.detail.threshold.filter(|_| n.kind != EventKind::Flapping),
        changes: n.detail.threshold.filter(|_| n.kind == EventKind::Flapping),
        window_s: n.detail.window_s,
        fault: n.detail.fault.map(|f| f.to_string()),
        schedule: n
            .body
            .as_deref()
            .filter(|_| n.kind == EventKind::StateOutOfSchedule)
            .and_then(|b| serde_json::from_str(b).ok()),
        alarm_id: n.alarm_id.as_deref(),
    };
    serde_json::to_vec(&p).expect("payload serializes")
}

/// A site's or an alarm's notification (DESIGN §4): its id, type, time and alarm, then its
/// own fields as they were stored with it (the site, the client's sensors of it; the alarm
/// acknowledged, by whom).
fn own_payload(id: &str, kind: &str, at: Millis, alarm_id: Option<&str>, own: &str) -> Vec<u8> {
    let mut head = serde_json::json!({
        "id": id, "type": kind, "occurred_at": time::format(at)
    });
    // An acknowledgement and an escalation name their alarm in their own fields.
    let of_alarm = EventKind::parse(kind).is_some_and(EventKind::is_alarm);
    if let (Some(alarm), false) = (alarm_id, of_alarm) {
        head["alarm_id"] = alarm.into();
    }
    let head = serde_json::to_vec(&head).expect("a head serializes");
    let own = own.trim();
    match own.strip_prefix('{').filter(|rest| rest.trim() != "}") {
        Some(rest) => {
            let mut body = Vec::with_capacity(head.len() + own.len());
            body.extend_from_slice(&head[..head.len() - 1]);
            body.push(b',');
            body.extend_from_slice(rest.as_bytes());
            body
        }
        None => head,
    }
}

/// The body of a batch: `{"id", "type": "batch", "events": [...]}`, each event exactly
/// the body its notification would have had alone ([`payload`]).
pub fn batch_payload(id: &str, sends: &[Box<Sendable>]) -> Vec<u8> {
    envelope(id, sends.len(), sends.iter().map(|s| payload(s)))
}

/// A batch of `n` events' bodies.
pub(super) fn envelope(id: &str, n: usize, events: impl Iterator<Item = Vec<u8>>) -> Vec<u8> {
    let head = serde_json::to_vec(&serde_json::json!({"id": id, "type": BATCH}))
        .expect("a batch head serializes");
    // `{"id":…,"type":"batch"` then `,"events":[…]}`.
    let mut body = Vec::with_capacity(head.len() + 16 + 400 * n);
    body.extend_from_slice(&head[..head.len() - 1]);
    body.extend_from_slice(b",\"events\":[");
    for (i, event) in events.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&event);
    }
    body.extend_from_slice(b"]}");
    body
}

/// The body of a `client.test` notification: about no sensor, so it names the client.
#[derive(Serialize)]
struct TestPayload<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    occurred_at: String,
    client: ClientRef<'a>,
}

#[derive(Serialize)]
struct ClientRef<'a> {
    id: &'a str,
    name: &'a str,
}

/// The body of `client.test` number `id` to client `client_id` named `name`, sent at `at`.
pub fn test_payload(id: &str, client_id: &str, name: &str, at: Millis) -> Vec<u8> {
    let body = TestPayload {
        id,
        kind: CLIENT_TEST,
        occurred_at: time::format(at),
        client: ClientRef {
            id: client_id,
            name,
        },
    };
    serde_json::to_vec(&body).expect("payload serializes")
}

/// Why an attempt has no answer to read: no HTTP status came back, and no broker
/// acknowledged it. The retry policy, the attempts metric and the one-request-at-a-time
/// rule for silent endpoints read this; the text beside it (the stored `error`) is for
/// people, and nothing reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing answered within the delivery timeout.
    Timeout,
    /// No connection: it could not be made, or broke with the attempt in flight.
    Connection,
    /// Cut off by a stop whose shutdown grace ran out before an answer came.
    CutOff,
    /// The SSRF guard refused the destination: nothing was sent, and trying again cannot
    /// change that until the client's URL or the allow list does.
    NotAllowed,
    /// The receiver's OAuth2 token could not be had from its token endpoint.
    AuthFailed,
    /// A broker answered no: a refused login, a negative acknowledgement, a return.
    BrokerRefused,
    /// Nothing could be sent: the client's URL, secret or certificate cannot be used.
    Unusable,
}

impl Failure {
    /// The `outcome` label of the attempts metric.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Timeout => outcome::TIMEOUT,
            Failure::Connection | Failure::CutOff | Failure::Unusable => outcome::CONNECTION_ERROR,
            Failure::NotAllowed => outcome::NOT_ALLOWED,
            Failure::AuthFailed => outcome::AUTH_FAILED,
            Failure::BrokerRefused => outcome::BROKER_REFUSED,
        }
    }
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub at: Millis,
    pub status_code: Option<u16>,
    /// Why there was no answer; `None` when one came (an HTTP status, a broker's
    /// acknowledgement).
    pub failure: Option<Failure>,
    /// What went wrong, in words: the attempt's recorded error.
    pub error: Option<String>,
    pub duration: Duration,
    /// `Retry-After` of a 429 or 503 answer.
    pub retry_after: Option<Duration>,
}

impl AttemptResult {
    /// An HTTP answer: delivered on 2xx, else an error naming the status.
    pub fn answered(
        at: Millis,
        code: u16,
        duration: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            at,
            status_code: Some(code),
            failure: None,
            error: match code {
                200..300 => None,
                300..400 => Some(format!("HTTP {code} (redirects are not followed)")),
                _ => Some(format!("HTTP {code}")),
            },
            duration,
            retry_after,
        }
    }

    /// A broker took the message (PUBACK, publisher confirm): delivered.
    pub fn acknowledged(at: Millis, duration: Duration) -> Self {
        Self {
            at,
            status_code: None,
            failure: None,
            error: None,
            duration,
            retry_after: None,
        }
    }

    /// No answer, for `failure`; `error` says what happened.
    pub fn failed(at: Millis, failure: Failure, error: String, duration: Duration) -> Self {
        Self {
            at,
            status_code: None,
            failure: Some(failure),
            error: Some(error),
            duration,
            retry_after: None,
        }
    }

    pub fn delivered(&self) -> bool {
        crate::domain::notification::delivered(self.status_code, self.error.as_deref())
    }

    /// Nothing answered: the attempt got no status and no broker's answer (not a refusal
    /// of the SSRF guard or of a broker, which are answers). Such an endpoint holds a
    /// request slot for as long as it lets it, so its client is sent one request at a
    /// time until it answers again ([`super::lanes`]).
    pub fn unanswered(&self) -> bool {
        self.failure
            .is_some_and(|f| !matches!(f, Failure::NotAllowed | Failure::BrokerRefused))
    }

    /// `410 Gone`: the receiver asks never to be tried again.
    pub fn gone(&self) -> bool {
        self.status_code == Some(410)
    }

    /// The SSRF guard refused the destination.
    pub fn not_allowed(&self) -> bool {
        self.failure == Some(Failure::NotAllowed)
    }

    /// The `outcome` label of the attempts metric.
    pub fn label(&self) -> &'static str {
        match (self.failure, self.status_code) {
            (Some(f), _) => f.label(),
            (None, Some(c)) if !(200..300).contains(&c) => outcome::HTTP_ERROR,
            (None, _) => outcome::DELIVERED,
        }
    }
}

/// The innermost cause of an error, which says what went wrong in the fewest words.
pub(super) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the metric, the retry policy and the silent-endpoint rule read of an attempt
    /// comes from its kind, whatever its text says.
    #[test]
    fn an_attempt_is_read_by_its_kind_not_its_text() {
        let none = Duration::ZERO;
        let failed = |f: Failure| AttemptResult::failed(0, f, "timed out, or so".into(), none);
        let cases = [
            (Failure::Timeout, outcome::TIMEOUT, true),
            (Failure::Connection, outcome::CONNECTION_ERROR, true),
            (Failure::CutOff, outcome::CONNECTION_ERROR, true),
            (Failure::Unusable, outcome::CONNECTION_ERROR, true),
            (Failure::AuthFailed, outcome::AUTH_FAILED, true),
            (Failure::NotAllowed, outcome::NOT_ALLOWED, false),
            (Failure::BrokerRefused, outcome::BROKER_REFUSED, false),
        ];
        for (f, label, unanswered) in cases {
            let r = failed(f);
            assert_eq!(r.label(), label, "{f:?}");
            assert_eq!(r.unanswered(), unanswered, "{f:?}");
            assert_eq!(r.not_allowed(), f == Failure::NotAllowed, "{f:?}");
            assert!(!r.delivered(), "{f:?}");
        }
        let ok = AttemptResult::answered(0, 204, none, None);
        assert_eq!(
            (ok.label(), ok.delivered(), ok.unanswered()),
            (outcome::DELIVERED, true, false)
        );
        let refused = AttemptResult::answered(0, 503, none, Some(Duration::from_secs(2)));
        assert_eq!(refused.label(), outcome::HTTP_ERROR);
        assert_eq!(refused.error.as_deref(), Some("HTTP 503"));
        assert!(!refused.unanswered(), "an error status is an answer");
        let acked = AttemptResult::acknowledged(0, none);
        assert_eq!(
            (acked.label(), acked.delivered()),
            (outcome::DELIVERED, true)
        );
    }
}
