//! One attempt out: the POST with its Standard Webhooks headers (or, for
//! a client whose URL names a broker, the publish: [`super::broker`]).

use std::time::{Duration, Instant};

use tracing::Instrument;
use tracing::field::Empty;

use super::attempt::{
    AttemptResult, Failure, batch_payload, payload, root_cause, signatures, test_payload,
};
use super::auth::Grant;
use super::broker::Brokers;
use super::guard::{self, Guard, Refusal};
pub use super::receivers::Receivers;
use crate::domain::notification::new_notification_id;
use crate::domain::receiver::{Auth, Receiver};
use crate::domain::{Client, Millis, Sendable, destination};
use crate::telemetry::SPANS;

/// Sends one signed `client.test` to `client`'s URL now, through the same guard, signing
/// and timeout as any attempt. Nothing is stored and nothing is retried: the caller gets
/// what happened.
pub async fn send_test(
    receivers: &Receivers,
    guard: &Guard,
    client: &Client,
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let id = new_notification_id();
    let body = test_payload(&id, &client.id, &client.name, at);
    let previous = client
        .previous_secret
        .as_deref()
        .filter(|_| client.previous_secret_until.is_some_and(|until| until > at));
    let to = Target {
        url: &client.url,
        id: &id,
        secret: &client.secret,
        previous_secret: previous,
        client: &client.id,
        receiver: &client.receiver,
    };
    post(receivers, guard, to, body, timeout, at).await
}

/// Posts one notification (or publishes it, to a broker destination). Never fails: every
/// problem is an attempt result. `at` is when the attempt starts, by the dispatcher's
/// clock. `urls` holds the HTTP clients, which resolve names through the guard
/// ([`guard::GuardedResolver`]); an IP literal, which they do not resolve, is checked here.
pub async fn send(
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
    let result = if let Some(why) = &s.unopened {
        unopened(at, why)
    } else if destination::is_broker(&s.url) {
        brokers.send(s, timeout, at).instrument(span.clone()).await
    } else {
        let to = Target {
            url: &s.url,
            id: &n.id,
            secret: &s.secret,
            previous_secret: s.previous_secret.as_deref(),
            client: &n.client_id,
            receiver: &s.receiver,
        };
        post(urls, guard, to, payload(s), timeout, at)
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
    guard: &Guard,
    urls: &Urls,
    id: &str,
    sends: &[Box<Sendable>],
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let Some(first) = sends.first() else {
        return AttemptResult::failed(
            at,
            Failure::Unusable,
            "an empty batch is not sent".into(),
            Duration::ZERO,
        );
    };
    let span = tracing::debug_span!(target: SPANS, "delivery.batch",
        batch_id = %id, client_id = %first.notification.client_id, notifications = sends.len(),
        outcome = Empty, http.response.status_code = Empty, otel.status_code = Empty);
    if let Some(why) = &first.unopened {
        return unopened(at, why);
    }
    let to = Target {
        url: &first.url,
        id,
        secret: &first.secret,
        previous_secret: first.previous_secret.as_deref(),
        client: &first.notification.client_id,
        receiver: &first.receiver,
    };
    let result = post(urls, guard, to, batch_payload(id, sends), timeout, at)
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

/// The name the claimer knows [`Receivers`] by (it began as the cache of parsed URLs).
pub type Urls = Receivers;

/// Where a request goes and what signs it.
struct Target<'a> {
    url: &'a str,
    /// The `webhook-id`.
    id: &'a str,
    secret: &'a str,
    /// A rotated-out secret still in its grace: it signs too.
    previous_secret: Option<&'a str>,
    /// The client's id (its OAuth2 token is its own).
    client: &'a str,
    /// Its headers, authentication and certificate.
    receiver: &'a Receiver,
}

/// Checks, signs and POSTs `body` to an HTTP endpoint: an attempt of [`send`] or
/// [`send_test`], without the span. The whole attempt — a token fetched for it, the
/// request, and the one request again with a new token after a 401 — is bounded by
/// `timeout`.
async fn post(
    receivers: &Receivers,
    guard: &Guard,
    to: Target<'_>,
    body: Vec<u8>,
    timeout: Duration,
    at: Millis,
) -> AttemptResult {
    let started = Instant::now();
    let failed = |failure: Failure, error: String| {
        AttemptResult::failed(at, failure, error, started.elapsed())
    };
    let left = || timeout.saturating_sub(started.elapsed());
    let url = match receivers.parse(to.url) {
        Ok(u) => u,
        Err(e) => return failed(Failure::Unusable, format!("url unusable: {e}")),
    };
    let host = match guard.check_url(&url) {
        Ok(host) => host,
        Err(r) => return failed(Failure::NotAllowed, not_allowed(&r)),
    };
    // Through the proxy, the proxy resolves the name: the guard judges it here first.
    if let (Some(host), Some(_)) = (host, guard.proxy()) {
        let port = url.port_or_known_default().unwrap_or(443);
        if let Err(r) = guard.judge_name(host, port, left()).await {
            return failed(Failure::NotAllowed, not_allowed(&r));
        }
    }
    let ts = at / 1000;
    let signature = match signatures(to.secret, to.previous_secret, to.id, ts, &body) {
        Ok(sig) => sig,
        Err(e) => return failed(Failure::Unusable, format!("client secret unusable: {e}")),
    };
    let http = match receivers.http_for(to.receiver.tls.as_ref()) {
        Ok(h) => h,
        Err(e) => return failed(Failure::Unusable, e),
    };
    let grant = grant_of(&to);
    let mut token = None;
    if let Some(g) = &grant {
        match receivers
            .tokens
            .get(receivers.plain(), guard, g, left(), at)
            .await
        {
            Ok(t) => token = Some(t),
            Err(e) => return failed(Failure::AuthFailed, e),
        }
    }
    let request = |token: Option<&str>, body: Vec<u8>| {
        let r = http
            .post(url.clone())
            .timeout(left())
            .header("content-type", "application/json")
            .header("user-agent", concat!("latch/", env!("CARGO_PKG_VERSION")))
            .header("webhook-id", to.id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature.clone());
        with_receiver(r, to.receiver, token).body(body)
    };
    // The body again only for a client whose token may be refused.
    let again = grant.as_ref().map(|_| body.clone());
    let mut sent = request(token.as_deref(), body).send().await;
    if let (Ok(resp), Some(g), Some(used), Some(body)) = (&sent, &grant, &token, again)
        && resp.status().as_u16() == 401
    {
        // The receiver refused the token (revoked, or expired early): one new one, once.
        match receivers
            .tokens
            .renew(receivers.plain(), guard, g, used, left(), at)
            .await
        {
            Ok(fresh) => sent = request(Some(&fresh), body).send().await,
            Err(e) => return failed(Failure::AuthFailed, e),
        }
    }
    match sent {
        Ok(resp) => answered(resp, at, started).await,
        Err(e) => {
            let (failure, why) = failure_of(&e, timeout);
            failed(failure, why)
        }
    }
}

/// The OAuth2 grant of a receiver that authenticates with client credentials.
fn grant_of<'t>(to: &Target<'t>) -> Option<Grant<'t>> {
    match &to.receiver.auth {
        Some(Auth::OAuth2 {
            token_url,
            client_id,
            client_secret,
            scope,
            audience,
        }) => Some(Grant {
            client: to.client,
            token_url,
            client_id,
            client_secret,
            scope: scope.as_deref(),
            audience: audience.as_deref(),
        }),
        _ => None,
    }
}

/// A request with the receiver's headers and authentication: `token`, an OAuth2 token,
/// when it has one.
fn with_receiver(
    mut r: reqwest::RequestBuilder,
    receiver: &Receiver,
    token: Option<&str>,
) -> reqwest::RequestBuilder {
    for (name, value) in &receiver.headers {
        // Names and values were checked when set; marked sensitive, so no HTTP/2 table or
        // debug output keeps them.
        if let Ok(mut v) = reqwest::header::HeaderValue::from_str(value) {
            v.set_sensitive(true);
            r = r.header(name.as_str(), v);
        }
    }
    match (&receiver.auth, token) {
        (_, Some(t)) => r.bearer_auth(t),
        (Some(Auth::Bearer { token }), None) => r.bearer_auth(token),
        (Some(Auth::Basic { username, password }), None) => r.basic_auth(username, Some(password)),
        _ => r,
    }
}

/// The attempt a receiver answered, with what a 429 or 503 asked for in `Retry-After`.
async fn answered(resp: reqwest::Response, at: Millis, started: Instant) -> AttemptResult {
    let code = resp.status().as_u16();
    // On the clock the attempt was stamped with, not the machine's own.
    let answered_at = at + started.elapsed().as_millis() as Millis;
    let retry_after = if code == 429 || code == 503 {
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| super::retry::parse_retry_after(v, answered_at))
    } else {
        None
    };
    // Drain a little of the body so the connection can be reused, bounded in bytes too.
    super::answer::drain(resp).await;
    AttemptResult::answered(at, code, started.elapsed(), retry_after)
}

/// What a request that got no answer came to, and why in words.
fn failure_of(e: &reqwest::Error, timeout: Duration) -> (Failure, String) {
    if let Some(r) = guard::refusal_in(e) {
        (Failure::NotAllowed, not_allowed(r))
    } else if e.is_timeout() {
        (Failure::Timeout, format!("timed out after {timeout:?}"))
    } else if e.is_connect() {
        let why = format!("connection failed: {}", root_cause(e));
        (Failure::Connection, why)
    } else {
        (
            Failure::Connection,
            format!("request failed: {}", root_cause(e)),
        )
    }
}

/// An attempt whose client's secrets could not be opened: nothing is sent.
fn unopened(at: Millis, why: &str) -> AttemptResult {
    AttemptResult::failed(
        at,
        Failure::Unusable,
        format!("client secrets unusable: {why}"),
        Duration::ZERO,
    )
}

/// The recorded error of an attempt the guard refused: its code, then why.
fn not_allowed(r: &Refusal) -> String {
    format!("{}: {r}", guard::NOT_ALLOWED)
}
