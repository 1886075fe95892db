//! One attempt out: the POST with its Standard Webhooks headers (or, for
//! a client whose URL names a broker, the publish: [`super::broker`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::Instrument;
use tracing::field::Empty;

use super::attempt::{AttemptResult, batch_payload, payload, signatures};
use super::broker::Brokers;
use super::guard::{self, Guard, Refusal};
use crate::domain::notification::{CLIENT_TEST, new_notification_id};
use crate::domain::{Client, Millis, Sendable, destination, time};
use crate::telemetry::SPANS;

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
    post(http, guard, &Urls::default(), to, body, timeout, at).await
}

/// Posts one notification (or publishes it, to a broker destination). Never fails: every
/// problem is an attempt result. `at` is when the attempt starts, by the dispatcher's
/// clock. `http` resolves names through the guard ([`guard::GuardedResolver`]); an IP
/// literal, which it does not resolve, is checked here.
pub async fn send(
    http: &reqwest::Client,
    brokers: &Brokers,
    guard: &Guard,
    urls: &Urls,
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
        post(http, guard, urls, to, payload(s), timeout, at)
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

/// Posts one batch of a client's notifications ([`batch_payload`]), signed over the whole
/// body with the batch id as `webhook-id`. The URL and secrets are the first
/// notification's: a batch is one client's, read by one claim. Never fails, as [`send`].
pub async fn send_batch(
    http: &reqwest::Client,
    guard: &Guard,
    urls: &Urls,
    id: &str,
    sends: &[Box<Sendable>],
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let Some(first) = sends.first() else {
        return AttemptResult {
            at,
            status_code: None,
            error: Some("an empty batch is not sent".into()),
            duration: Duration::ZERO,
            retry_after: None,
        };
    };
    let span = tracing::debug_span!(target: SPANS, "delivery.batch",
        batch_id = %id, client_id = %first.notification.client_id, notifications = sends.len(),
        outcome = Empty, http.response.status_code = Empty, otel.status_code = Empty);
    let to = Target {
        url: &first.url,
        id,
        secret: &first.secret,
        previous_secret: first.previous_secret.as_deref(),
    };
    let result = post(http, guard, urls, to, batch_payload(id, sends), timeout, at)
        .instrument(span.clone())
        .await;
    if !span.is_disabled() {
        span.record("outcome", result.label());
        if let Some(code) = result.status_code {
            span.record("http.response.status_code", code);
        }
        if !result.delivered() {
            span.record("otel.status_code", "ERROR");
        }
    }
    result
}

/// Most client URLs [`Urls`] keeps; past it, it starts over.
const URLS_MAX: usize = 10_000;

/// Client URLs as parsed, so a URL is parsed once rather than on every attempt: the parse,
/// with its host's IDNA mapping, was ~8 % of a webhook's instructions (BENCHMARKS.md,
/// tenth pass). Emptied when it holds [`URLS_MAX`].
#[derive(Default)]
pub struct Urls(Mutex<HashMap<String, reqwest::Url>>);

impl Urls {
    fn parse(&self, url: &str) -> Result<reqwest::Url, String> {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = known.get(url) {
            return Ok(u.clone());
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
        if known.len() >= URLS_MAX {
            known.clear();
        }
        known.insert(url.to_owned(), parsed.clone());
        Ok(parsed)
    }
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
    urls: &Urls,
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
    let url = match urls.parse(to.url) {
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

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
