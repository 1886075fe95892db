//! OAuth2 tokens for receivers that want one (the client credentials grant): fetched from
//! the client's `token_url` through the same guarded HTTP client as webhooks, kept until
//! shortly before they expire, shared by all of a client's requests with one fetch in
//! flight at a time, and fetched again once when the receiver answers 401 to a token.
//!
//! A token endpoint that fails makes the attempt fail with [`AUTH_FAILED`] (retried like
//! any failed attempt, and shown in the client's health as its last error). Nothing of a
//! token or of the client secret ever goes into an error, a log line or a span.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::guard::Guard;
use crate::domain::Millis;

/// How an attempt's error starts when the token could not be had (and its metric outcome).
pub use crate::domain::outbox::outcome::AUTH_FAILED;

/// How long a token without `expires_in` is kept.
const DEFAULT_LIFETIME_MS: Millis = 300_000;
/// A token is fetched again this long before it expires (at most a tenth of its life), so
/// a request never carries one that runs out on the way.
const REFRESH_MARGIN_MS: Millis = 30_000;
/// Most tokens kept; past it, the cache starts over.
const TOKENS_MAX: usize = 10_000;

/// A client's OAuth2 settings, as one attempt uses them.
pub struct Grant<'a> {
    /// The latch client's id: tokens are never shared between clients.
    pub client: &'a str,
    pub token_url: &'a str,
    pub client_id: &'a str,
    pub client_secret: &'a str,
    pub scope: Option<&'a str>,
    pub audience: Option<&'a str>,
}

impl Grant<'_> {
    /// Which cache entry: the client and everything that makes its token, so a changed
    /// setting fetches a new one.
    fn key(&self, hasher: &foldhash::fast::RandomState) -> u64 {
        hasher.hash_one((
            self.client,
            self.token_url,
            self.client_id,
            self.client_secret,
            self.scope,
            self.audience,
        ))
    }
}

#[derive(Clone)]
struct Token {
    value: String,
    /// When to fetch a new one, by the dispatcher's clock.
    refresh_at: Millis,
}

/// Per client, its token (if any) behind a lock that one fetch holds at a time.
type Slot = Arc<tokio::sync::Mutex<Option<Token>>>;

/// The tokens of every client that uses OAuth2.
#[derive(Default)]
pub struct Tokens {
    slots: Mutex<HashMap<u64, Slot>>,
    hasher: foldhash::fast::RandomState,
}

impl Tokens {
    fn slot(&self, grant: &Grant<'_>) -> Slot {
        let key = grant.key(&self.hasher);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= TOKENS_MAX && !slots.contains_key(&key) {
            slots.clear();
        }
        slots.entry(key).or_default().clone()
    }

    /// A token for `grant` at `now`: the one kept, or a new one (other requests of the
    /// client wait for that fetch rather than make their own). The error is the attempt's.
    pub async fn get(
        &self,
        http: &reqwest::Client,
        guard: &Guard,
        grant: &Grant<'_>,
        timeout: Duration,
        now: Millis,
    ) -> Result<String, String> {
        let slot = self.slot(grant);
        let mut held = slot.lock().await;
        if let Some(t) = held.as_ref().filter(|t| t.refresh_at > now) {
            return Ok(t.value.clone());
        }
        let t = fetch(http, guard, grant, timeout, now).await?;
        *held = Some(t.clone());
        Ok(t.value)
    }

    /// The receiver refused `used` (401): a new token, unless another request of the
    /// client got one meanwhile, which is then used.
    pub async fn renew(
        &self,
        http: &reqwest::Client,
        guard: &Guard,
        grant: &Grant<'_>,
        used: &str,
        timeout: Duration,
        now: Millis,
    ) -> Result<String, String> {
        let slot = self.slot(grant);
        let mut held = slot.lock().await;
        if let Some(t) = held
            .as_ref()
            .filter(|t| t.value != used && t.refresh_at > now)
        {
            return Ok(t.value.clone());
        }
        *held = None;
        let t = fetch(http, guard, grant, timeout, now).await?;
        *held = Some(t.clone());
        Ok(t.value)
    }
}

/// What a token endpoint answers (RFC 6749 §5.1); `expires_in` as a number or, as some
/// servers send it, a string of one.
#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
}

/// `s` form-encoded (`application/x-www-form-urlencoded`).
fn form_encode(s: &str) -> String {
    let pair = serde_urlencoded::to_string([("k", s)]).unwrap_or_default();
    pair.strip_prefix("k=").unwrap_or_default().to_string()
}

/// The error of an attempt whose token could not be had.
fn failed(why: impl std::fmt::Display) -> String {
    format!("{AUTH_FAILED}: {why}")
}

/// One token request: the client credentials grant, the client authenticated with HTTP
/// Basic (RFC 6749 §2.3.1: both parts form-encoded first).
async fn fetch(
    http: &reqwest::Client,
    guard: &Guard,
    grant: &Grant<'_>,
    timeout: Duration,
    now: Millis,
) -> Result<Token, String> {
    // One deadline for every step: the name judged, the request, the answer read.
    let started = tokio::time::Instant::now();
    let url = reqwest::Url::parse(grant.token_url)
        .map_err(|e| failed(format!("token_url unusable: {e}")))?;
    let refused =
        |r: &super::guard::Refusal| failed(format!("the token endpoint is not allowed: {r}"));
    let host = guard.check_url(&url).map_err(|r| refused(&r))?;
    if let (Some(host), Some(_)) = (host, guard.proxy()) {
        let port = url.port_or_known_default().unwrap_or(443);
        guard
            .judge_name(host, port, timeout)
            .await
            .map_err(|r| refused(&r))?;
    }
    let mut form = vec![("grant_type", "client_credentials")];
    form.extend(grant.scope.map(|s| ("scope", s)));
    form.extend(grant.audience.map(|a| ("audience", a)));
    let answer = http
        .post(url)
        .timeout(timeout.saturating_sub(started.elapsed()))
        .basic_auth(
            form_encode(grant.client_id),
            Some(form_encode(grant.client_secret)),
        )
        .header("accept", "application/json")
        .header("user-agent", concat!("latch/", env!("CARGO_PKG_VERSION")))
        .form(&form)
        .send()
        .await
        .map_err(|e| {
            if let Some(r) = super::guard::refusal_in(&e) {
                refused(r)
            } else if e.is_timeout() {
                failed(format!(
                    "the token endpoint did not answer within {timeout:?}"
                ))
            } else {
                failed(format!(
                    "the token endpoint could not be reached: {}",
                    super::attempt::root_cause(&e)
                ))
            }
        })?;
    let status = answer.status().as_u16();
    let max = super::answer::TOKEN_ANSWER_MAX;
    let body = tokio::time::timeout_at(started + timeout, super::answer::read_at_most(answer, max))
        .await
        .map_err(|_| failed("the token endpoint's answer did not arrive in time"))?
        .map_err(|e| failed(format!("the token endpoint's answer was cut off: {e}")))?
        .ok_or_else(|| {
            failed(format!(
                "the token endpoint's answer is larger than {} KiB",
                max / 1024
            ))
        })?;
    if !(200..300).contains(&status) {
        // The OAuth2 error code says why (`invalid_client`, …); its description may quote
        // what was sent, so it is left out.
        let code = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_string))
            .filter(|c| c.len() <= 64 && c.chars().all(|c| c.is_ascii_graphic()));
        return Err(failed(match code {
            Some(code) => format!("the token endpoint answered HTTP {status} ({code})"),
            None => format!("the token endpoint answered HTTP {status}"),
        }));
    }
    let answer: TokenAnswer = serde_json::from_slice(&body)
        .map_err(|_| failed("the token endpoint's answer is not JSON"))?;
    let Some(value) = answer.access_token.filter(|t| !t.is_empty()) else {
        return Err(failed("the token endpoint's answer holds no access_token"));
    };
    if let Some(kind) = answer.token_type
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(failed(format!(
            "the token endpoint gave a {kind:?} token; only bearer tokens are sent"
        )));
    }
    if !value.chars().all(|c| c.is_ascii_graphic()) {
        return Err(failed("the token endpoint's token cannot go in a header"));
    }
    let lifetime = match answer.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_f64(),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|s| s.is_finite() && *s > 0.0)
    .map_or(DEFAULT_LIFETIME_MS, |s| (s * 1000.0).min(1e12) as Millis);
    let margin = REFRESH_MARGIN_MS.min(lifetime / 10);
    Ok(Token {
        value,
        refresh_at: now + lifetime - margin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token endpoint on loopback whose answer is a valid token padded to `size` bytes.
    async fn endpoint(size: usize) -> String {
        let token = serde_json::json!({"access_token": "t-1", "token_type": "bearer",
            "padding": "x".repeat(size)});
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move || {
                let token = token.clone();
                async move { axum::Json(token) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/token")
    }

    /// Issue #69: a token endpoint's answer is read up to 64 KiB; a larger one fails the
    /// fetch rather than being held whole (one streaming gigabytes took the node down).
    #[tokio::test]
    async fn a_token_answer_past_64_kib_fails_the_fetch() {
        let guard = Guard::new(vec!["127.0.0.0/8".parse().unwrap()], false);
        let http = reqwest::Client::new();
        for (size, ok) in [
            (1000, true),
            (super::super::answer::TOKEN_ANSWER_MAX, false),
        ] {
            let url = endpoint(size).await;
            let grant = Grant {
                client: "c",
                token_url: &url,
                client_id: "id",
                client_secret: "secret",
                scope: None,
                audience: None,
            };
            let got = fetch(&http, &guard, &grant, Duration::from_secs(10), 0).await;
            match (ok, got) {
                (true, Ok(t)) => assert_eq!(t.value, "t-1"),
                (false, Err(e)) => assert!(e.contains("larger than 64 KiB"), "{e}"),
                (_, got) => panic!("{size} bytes: {:?}", got.map(|t| t.value)),
            }
        }
    }
}
