//! One attempt: the payload of DESIGN §4, its Standard Webhooks headers, the POST (or, for
//! a client whose URL names a broker, the publish: [`super::broker`]).

use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::Instrument;
use tracing::field::Empty;

use super::broker::{self, Brokers};
use super::guard::{self, Guard, Refusal};
use super::signing;
use crate::domain::notification::{CLIENT_TEST, new_notification_id};
use crate::domain::outbox::outcome;
use crate::domain::{Client, EventKind, Millis, Sendable, client::secret_key, destination, time};
use crate::telemetry::SPANS;

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

/// Sends one signed `client.test` to `client`'s URL now, through the same guard, signing
/// and timeout as any attempt. Nothing is stored and nothing is retried: the caller gets
/// what happened.
pub async fn send_test(
    http: &reqwest::Client,
    guard: &Guard,
    client: &Client,
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let id = new_notification_id();
    let body = TestPayload {
        id: &id,
        kind: CLIENT_TEST,
        occurred_at: time::format(at),
        client: ClientRef {
            id: &client.id,
            name: &client.name,
        },
    };
    let body = serde_json::to_vec(&body).expect("payload serializes");
    let previous = client
        .previous_secret
        .as_deref()
        .filter(|_| client.previous_secret_until.is_some_and(|until| until > at));
    let to = Target {
        url: &client.url,
        id: &id,
        secret: &client.secret,
        previous_secret: previous,
    };
    post(http, guard, to, body, timeout, at).await
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
                .is_some_and(|e| e.starts_with(broker::REFUSED)) =>
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

/// Posts one notification (or publishes it, to a broker destination). Never fails: every
/// problem is an attempt result. `at` is when the attempt starts, by the dispatcher's
/// clock. `http` resolves names through the guard ([`guard::GuardedResolver`]); an IP
/// literal, which it does not resolve, is checked here.
pub async fn send(
    http: &reqwest::Client,
    brokers: &Brokers,
    guard: &Guard,
    s: &Sendable,
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    // One attempt, named by its notification: a debug span for the log, and for OTLP
    // when traces are on (see `telemetry`); off, it costs a check of the callsite.
    let n = &s.notification;
    let span = tracing::debug_span!(target: SPANS, "delivery.attempt",
        notification_id = %n.id, client_id = %n.client_id, sensor_id = %n.sensor_id,
        event = n.kind.as_str(), attempt = n.attempts + 1, outcome = Empty,
        http.response.status_code = Empty, otel.status_code = Empty);
    let result = if destination::is_broker(&s.url) {
        brokers.send(s, timeout, at).instrument(span.clone()).await
    } else {
        let to = Target {
            url: &s.url,
            id: &n.id,
            secret: &s.secret,
            previous_secret: s.previous_secret.as_deref(),
        };
        post(http, guard, to, payload(s), timeout, at)
            .instrument(span.clone())
            .await
    };
    if !span.is_disabled() {
        span.record("outcome", result.label());
        if let Some(code) = result.status_code {
            span.record("http.response.status_code", code);
        }
        if !result.delivered() {
            span.record("otel.status_code", "ERROR");
        }
        let _in = span.enter();
        tracing::debug!(
            status = result.status_code,
            error = result.error.as_deref(),
            ms = result.duration.as_millis() as u64,
            "Attempt made."
        );
    }
    result
}

/// Where a request goes and what signs it.
struct Target<'a> {
    url: &'a str,
    /// The `webhook-id`.
    id: &'a str,
    secret: &'a str,
    /// A rotated-out secret still in its grace: it signs too.
    previous_secret: Option<&'a str>,
}

/// Checks, signs and POSTs `body` to an HTTP endpoint: an attempt of [`send`] or
/// [`send_test`], without the span.
async fn post(
    http: &reqwest::Client,
    guard: &Guard,
    to: Target<'_>,
    body: Vec<u8>,
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let started = Instant::now();
    let failed = |error: String| AttemptResult {
        at,
        status_code: None,
        error: Some(error),
        duration: started.elapsed(),
        retry_after: None,
    };
    let url = match reqwest::Url::parse(to.url) {
        Ok(u) => u,
        Err(e) => return failed(format!("url unusable: {e}")),
    };
    if let Err(r) = guard.check_url(&url) {
        return failed(not_allowed(&r));
    }
    let ts = at / 1000;
    let signature = match signatures(to.secret, to.previous_secret, to.id, ts, &body) {
        Ok(sig) => sig,
        Err(e) => return failed(format!("client secret unusable: {e}")),
    };
    let request = http
        .post(url)
        .timeout(timeout)
        .header("content-type", "application/json")
        .header("user-agent", concat!("latch/", env!("CARGO_PKG_VERSION")))
        .header("webhook-id", to.id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body);
    match request.send().await {
        Ok(resp) => {
            let code = resp.status().as_u16();
            let retry_after = if code == 429 || code == 503 {
                resp.headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| super::retry::parse_retry_after(v, chrono::Utc::now()))
            } else {
                None
            };
            // Drain a little of the body so the connection can be reused.
            let _ = tokio::time::timeout(Duration::from_millis(200), resp.bytes()).await;
            AttemptResult {
                at,
                status_code: Some(code),
                error: match code {
                    200..300 => None,
                    300..400 => Some(format!("HTTP {code} (redirects are not followed)")),
                    _ => Some(format!("HTTP {code}")),
                },
                duration: started.elapsed(),
                retry_after,
            }
        }
        Err(e) => {
            let error = if let Some(r) = guard::refusal_in(&e) {
                not_allowed(r)
            } else if e.is_timeout() {
                format!("timed out after {timeout:?}")
            } else if e.is_connect() {
                format!("connection failed: {}", root_cause(&e))
            } else {
                format!("request failed: {}", root_cause(&e))
            };
            failed(error)
        }
    }
}

/// The recorded error of an attempt the guard refused: its code, then why.
fn not_allowed(r: &Refusal) -> String {
    format!("{}: {r}", guard::NOT_ALLOWED)
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

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
