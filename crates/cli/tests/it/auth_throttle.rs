//! Failed logins, as someone guessing tokens meets them: after the allowed failures from
//! one address every `/v1` request from it is 429 with `Retry-After` — a right token too,
//! so a guess cannot be tested while throttled — other addresses and successful callers
//! are untouched, and `/metrics` counts the failures by reason.

use reqwest::Method;
use serde_json::Value;

use crate::utils::TestServer;

/// A GET with `token` as bearer (none: no header) from `http`: status, `Retry-After`, body.
async fn get(
    s: &TestServer,
    http: &reqwest::Client,
    token: Option<&str>,
    path: &str,
) -> (u16, Option<String>, Value) {
    let mut req = http.request(Method::GET, format!("{}{path}", s.base));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, retry_after, body)
}

/// A client whose requests come from `ip` (another loopback address is another peer).
fn from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .build()
        .unwrap()
}

#[tokio::test]
async fn failed_logins_from_an_address_are_throttled_before_the_token_is_looked_at() {
    let token = format!("boot-{}", crate::utils::unique("t"));
    let s = TestServer::start_with({
        let token = token.clone();
        move |c| {
            c.api_token = Some(token);
            // No refill within the test: exactly three failures are answered 401.
            c.auth_failure_limit = latch::config::RateLimit::parse("1/m burst 3").ok();
        }
    })
    .await;
    let guesser = from([127, 0, 0, 3]);
    let user = from([127, 0, 0, 4]);
    let before = failures(&s).await;
    // Successful logins are never counted: more of them than the failures allowed.
    for _ in 0..5 {
        let (st, _, body) = get(&s, &user, Some(&token), "/v1/sensors").await;
        assert_eq!(st, 200, "{body}");
    }
    let (st, _, _) = get(&s, &guesser, None, "/v1/sensors").await;
    assert_eq!(st, 401, "no token");
    for guess in ["guess-1", "guess-2"] {
        let (st, _, body) = get(&s, &guesser, Some(guess), "/v1/sensors").await;
        assert_eq!(st, 401, "{body}");
    }
    let (st, retry_after, body) = get(&s, &guesser, Some("guess-3"), "/v1/sensors").await;
    assert_eq!(st, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
    // Throttled, the right token is refused as well: the answer tells nothing of a guess.
    let (st, _, body) = get(&s, &guesser, Some(&token), "/v1/sensors").await;
    assert_eq!(st, 429, "{body}");
    // Another address, with the token, is served as before.
    let (st, _, body) = get(&s, &user, Some(&token), "/v1/sensors").await;
    assert_eq!(st, 200, "{body}");
    let after = failures(&s).await;
    // The registry is the test process's, shared with tests running beside this one: at
    // least this test's failures were counted.
    for (reason, n) in [("missing_token", 1), ("unknown_token", 2), ("throttled", 2)] {
        assert!(
            after[reason] - before[reason] >= n,
            "{reason}: {before:?} -> {after:?}"
        );
    }
    s.stop().await;
}

/// `latch_http_auth_failures_total` by reason, as `/metrics` shows it.
async fn failures(s: &TestServer) -> std::collections::HashMap<String, u64> {
    let (_, _, metrics) = get(s, &s.http, None, "/metrics").await;
    let prefix = "latch_http_auth_failures_total{reason=\"";
    metrics
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(reason, n)| (reason.to_string(), n.parse().unwrap()))
        .collect()
}

#[tokio::test]
async fn failed_logins_are_throttled_by_default_and_counted_from_the_first_scrape() {
    let token = format!("boot-{}", crate::utils::unique("t"));
    let s = TestServer::start_with({
        let token = token.clone();
        move |c| c.api_token = Some(token)
    })
    .await;
    let guesser = from([127, 0, 0, 5]);
    let shown = failures(&s).await;
    for reason in [
        "missing_token",
        "unknown_token",
        "cluster_secret",
        "throttled",
    ] {
        assert!(shown.contains_key(reason), "{reason}: {shown:?}");
    }
    let mut answers = Vec::new();
    for i in 0..30 {
        let (st, _, _) = get(&s, &guesser, Some(&format!("guess-{i}")), "/v1/sensors").await;
        answers.push(st);
    }
    assert_eq!(answers.first(), Some(&401));
    assert_eq!(answers.last(), Some(&429), "{answers:?}");
    s.stop().await;
}
