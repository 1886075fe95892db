//! A local webhook receiver: answers as told and keeps what a test or a bench needs of
//! what it got. A test's receiver holds every body to the event catalog ([`crate::bodies`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use latch::domain::time;

use crate::bodies::{Violations, Watch};

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Value,
    pub raw: Bytes,
    pub at: Instant,
}

/// What a receiver answers.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    pub delay: Duration,
    pub retry_after: Option<u64>,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            delay: Duration::ZERO,
            retry_after: None,
        }
    }
}

/// How much a receiver keeps of each request. A bench of millions of requests measures
/// latch's memory, so its receiver must not grow with every request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Every request whole, in order, and how many were in flight at once (tests).
    Everything,
    /// Per answered request its latency from `occurred_at`, and how often each
    /// notification id came (`latch bench deliver`).
    Stats,
    /// Only the counts (`latch bench soak`).
    Counts,
}

#[derive(Default)]
struct Kept {
    got: Vec<Received>,
    script: VecDeque<Answer>,
    default: Option<Answer>,
    inflight: HashMap<String, u32>,
    max_inflight_per_sensor: u32,
    inflight_total: u32,
    max_inflight_total: u32,
    latencies: Vec<f64>,
    by_id: HashMap<String, u32>,
    /// Answered notifications by `type` (a batch's events each).
    by_type: HashMap<String, u64>,
    /// How many of the next requests to hold until [`Receiver::release`].
    hold_next: usize,
}

struct Shared {
    keep: Keep,
    requests: AtomicU64,
    ok: AtomicU64,
    /// Notifications in requests answered with a 2xx: one a request, or a batch's events.
    events_ok: AtomicU64,
    /// Per 10,000 requests, how many to fail with 500 (spread evenly, no RNG).
    fail_per_10k: AtomicU64,
    kept: Mutex<Kept>,
    /// Whether held requests may be answered ([`Receiver::hold`]).
    released: tokio::sync::watch::Sender<bool>,
    /// Bodies that broke their schema ([`Keep::Everything`] only: a bench's receiver
    /// spends nothing on it).
    violations: Violations,
}

/// An OAuth2 token endpoint on loopback that answers every request with `token`, a bearer
/// token for an hour (for a bench of authenticated webhooks); its URL.
pub async fn token_endpoint(token: &str) -> std::io::Result<String> {
    let answer = serde_json::json!({"access_token": token, "token_type": "Bearer",
        "expires_in": 3600});
    let app = axum::Router::new().route(
        "/token",
        axum::routing::post(move || async move { axum::Json(answer) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/token", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// A receiver on `127.0.0.1:0` at `url`; answers from its script, then its default (200
/// unless changed).
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
    /// Fails the test on the last handle's drop if a body broke its schema.
    _watch: Arc<Watch>,
}

impl Receiver {
    /// A receiver that keeps every request (what tests want).
    pub async fn start() -> Self {
        Self::start_keeping(Keep::Everything)
            .await
            .expect("a local receiver starts")
    }

    pub async fn start_keeping(keep: Keep) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        Ok(Self::start_on(listener, url, keep))
    }

    /// A receiver answering on `listener` (a TLS one, for tests of client certificates),
    /// which clients reach at `url`.
    pub fn start_on<L>(listener: L, url: String, keep: Keep) -> Self
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let shared = Arc::new(Shared {
            keep,
            requests: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            events_ok: AtomicU64::new(0),
            fail_per_10k: AtomicU64::new(0),
            kept: Mutex::new(Kept::default()),
            released: tokio::sync::watch::Sender::new(true),
            violations: Violations::default(),
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let watch = Arc::new(Watch(shared.violations.clone()));
        Self {
            url,
            shared,
            _watch: watch,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.shared.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers these first, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.kept().script.extend(answers);
    }

    /// Holds the next `n` requests, after their answers' delays, until [`Self::release`]:
    /// a test that needs requests in flight while something happens releases them when it
    /// is done, however long that took, instead of racing a fixed delay.
    pub fn hold(&self, n: usize) {
        self.kept().hold_next = n;
        self.shared.released.send_replace(false);
    }

    /// Answers the held requests.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    /// Answers this once the script is used up.
    pub fn always(&self, answer: Answer) {
        self.kept().default = Some(answer);
    }

    /// Fails this many of every 10,000 requests with 500.
    pub fn fail_per_10k(&self, n: u64) {
        self.shared.fail_per_10k.store(n, Ordering::Relaxed);
    }

    /// Every request so far ([`Keep::Everything`] only); panics if a body broke its
    /// schema.
    pub fn received(&self) -> Vec<Received> {
        self.shared.violations.assert_none();
        self.kept().got.clone()
    }

    /// Requests so far, answered or not.
    pub fn count(&self) -> usize {
        self.requests() as usize
    }

    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Requests answered with a 2xx.
    pub fn ok(&self) -> u64 {
        self.shared.ok.load(Ordering::Relaxed)
    }

    /// Notifications in requests answered with a 2xx: each request one, a batch its
    /// events ([`Keep::Counts`] counts a request as one).
    pub fn events_ok(&self) -> u64 {
        self.shared.events_ok.load(Ordering::Relaxed)
    }

    /// Answered notifications of type `kind` (a batch's events each; not with
    /// [`Keep::Counts`]).
    pub fn events_of(&self, kind: &str) -> u64 {
        self.kept().by_type.get(kind).copied().unwrap_or(0)
    }

    /// Milliseconds from `occurred_at` to arrival of each 2xx-answered notification (a
    /// batch's events each).
    pub fn latencies(&self) -> Vec<f64> {
        self.kept().latencies.clone()
    }

    /// Answered notifications beyond the first of each notification id (a batch's events
    /// each).
    pub fn duplicates(&self) -> u64 {
        self.kept()
            .by_id
            .values()
            .map(|n| u64::from(n.saturating_sub(1)))
            .sum()
    }

    pub fn max_inflight_per_sensor(&self) -> u32 {
        self.kept().max_inflight_per_sensor
    }

    /// Most requests it was answering at once.
    pub fn max_inflight(&self) -> u32 {
        self.kept().max_inflight_total
    }

    /// The bodies about sensor `sensor` (of type `kind` when given) that arrived so far, in
    /// order, once there are at least `n`; panics after 15 s (tests).
    pub async fn bodies_of(&self, sensor: &str, kind: Option<&str>, n: usize) -> Vec<Value> {
        let what = format!("{n} {} of {sensor}", kind.unwrap_or("notifications"));
        super::eventually(15, &what, || async {
            let got: Vec<Value> = self
                .received()
                .into_iter()
                .map(|g| g.body)
                .filter(|b| b["sensor"]["id"] == sensor && kind.is_none_or(|k| b["type"] == k))
                .collect();
            (got.len() >= n).then_some(got)
        })
        .await
    }

    /// Waits until at least `n` requests arrived; panics after `secs` (tests).
    pub async fn wait_for(&self, n: usize, secs: u64) -> Vec<Received> {
        super::eventually(secs, &format!("{n} webhook requests"), || async {
            let got = self.received();
            (got.len() >= n).then_some(got)
        })
        .await
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    raw: Bytes,
) -> (StatusCode, HeaderMap) {
    let now = time::now_ms();
    let n = shared.requests.fetch_add(1, Ordering::Relaxed);
    let fail = shared.fail_per_10k.load(Ordering::Relaxed);
    let fail = fail > 0 && (n.wrapping_mul(7919) % 10_000) < fail;
    if shared.keep == Keep::Counts {
        if fail {
            return (StatusCode::INTERNAL_SERVER_ERROR, HeaderMap::new());
        }
        shared.ok.fetch_add(1, Ordering::Relaxed);
        shared.events_ok.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::OK, HeaderMap::new());
    }
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let sensor = body["sensor"]["id"].as_str().unwrap_or("").to_string();
    let everything = shared.keep == Keep::Everything;
    if everything {
        shared.violations.check(&raw);
    }
    let (answer, held) = {
        let mut k = shared.kept.lock().unwrap_or_else(|p| p.into_inner());
        let held = k.hold_next > 0;
        k.hold_next = k.hold_next.saturating_sub(1);
        let answer = if fail {
            Answer::status(500)
        } else {
            k.script
                .pop_front()
                .or(k.default)
                .unwrap_or(Answer::status(200))
        };
        if (200..300).contains(&answer.status) {
            shared.ok.fetch_add(1, Ordering::Relaxed);
            let events: Vec<&Value> = match body["events"].as_array() {
                Some(events) if body["type"] == "batch" => events.iter().collect(),
                _ => vec![&body],
            };
            shared
                .events_ok
                .fetch_add(events.len() as u64, Ordering::Relaxed);
            for e in events {
                if let Some(at) = e["occurred_at"].as_str().and_then(time::parse) {
                    k.latencies.push((now - at) as f64);
                }
                if let Some(id) = e["id"].as_str() {
                    *k.by_id.entry(id.to_string()).or_default() += 1;
                }
                if let Some(t) = e["type"].as_str() {
                    *k.by_type.entry(t.to_string()).or_default() += 1;
                }
            }
        }
        if everything {
            let n = k.inflight.entry(sensor.clone()).or_default();
            *n += 1;
            let n = *n;
            k.max_inflight_per_sensor = k.max_inflight_per_sensor.max(n);
            k.inflight_total += 1;
            k.max_inflight_total = k.max_inflight_total.max(k.inflight_total);
            k.got.push(Received {
                headers: headers.clone(),
                body,
                raw,
                at: Instant::now(),
            });
        }
        (answer, held)
    };
    // Counted out even when the sender hangs up mid-answer (a killed node): the handler is
    // then dropped, and the guard still runs.
    struct Out(Option<(Arc<Shared>, String)>);
    impl Drop for Out {
        fn drop(&mut self) {
            if let Some((shared, sensor)) = self.0.take() {
                let mut k = shared.kept.lock().unwrap_or_else(|p| p.into_inner());
                *k.inflight.entry(sensor).or_default() -= 1;
                k.inflight_total -= 1;
            }
        }
    }
    let _out = Out(everything.then(|| (shared.clone(), sensor)));
    tokio::time::sleep(answer.delay).await;
    if held {
        // The sender lives in `shared`, so this ends only on release.
        let _ = shared.released.subscribe().wait_for(|r| *r).await;
    }
    let mut h = HeaderMap::new();
    if let Some(s) = answer.retry_after {
        h.insert("retry-after", s.into());
    }
    (
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        h,
    )
}
