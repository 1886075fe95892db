//! Test harness: the real latch service on a port-0 listener, a JSON HTTP client, and
//! webhook receivers that record what they get and answer as told.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use latch::config::Config;
use serde_json::{Value, json};
use tokio::sync::oneshot;

pub mod fault;

/// A running latch, stopped gracefully by [`TestServer::stop`].
pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub dir: PathBuf,
    _tmp: Option<Arc<tempfile::TempDir>>,
    token: Option<String>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// Settings most tests want: quick retries, quick timeouts.
pub fn fast_config(dir: &Path) -> Config {
    let mut c = Config::for_data_dir(dir);
    c.sqlite_synchronous = latch::store::sqlite::Synchronous::Normal;
    c.retry_base = Duration::from_millis(200);
    c.retry_max_delay = Duration::from_secs(5);
    c.delivery_timeout = Duration::from_secs(2);
    c.shutdown_grace = Duration::from_secs(3);
    c
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let tmp = Arc::new(tempfile::tempdir().unwrap());
        let mut s = Self::start_in(tmp.path(), tweak).await;
        s._tmp = Some(tmp);
        s
    }

    /// Starts on an existing data folder (restart tests).
    pub async fn start_in(dir: &Path, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = fast_config(dir);
        config.database_url = database_url(dir).await;
        tweak(&mut config);
        let token = config.api_token.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(latch::run(Arc::new(config), listener, async {
            let _ = rx.await;
        }));
        let s = Self {
            base,
            http: reqwest::Client::new(),
            dir: dir.to_path_buf(),
            _tmp: None,
            token,
            shutdown: Some(tx),
            task: Some(task),
        };
        s.wait_ready().await;
        s
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(Instant::now() < deadline, "latch did not become ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Graceful stop; returns the data folder's owner so a restart can reuse it.
    pub async fn stop(mut self) -> Option<Arc<tempfile::TempDir>> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        self._tmp.take()
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }
    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::PUT, path, Some(body)).await
    }
    pub async fn put_empty(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::PUT, path, None).await
    }
    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::DELETE, path, None).await
    }

    /// How many readings a sensor's history holds (up to 1000).
    pub async fn reading_count(&self, id: &str) -> usize {
        let (_, body) = self
            .get(&format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        body["items"].as_array().map_or(0, Vec::len)
    }

    /// Registers a sensor and asserts it worked.
    pub async fn sensor(&self, id: &str) {
        let (s, body) = self
            .post(
                "/v1/sensors",
                json!({"id": id, "address": format!("{id} street 1")}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }

    /// Registers a client for `url` and returns its id.
    pub async fn client(&self, url: &str) -> String {
        let (s, body) = self
            .post("/v1/clients", json!({"name": "test", "url": url}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    pub async fn link(&self, client: &str, sensor: &str) {
        let (s, body) = self
            .put_empty(&format!("/v1/clients/{client}/sensors/{sensor}"))
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
    }

    /// Posts readings and asserts all were accepted.
    pub async fn readings(&self, readings: Value) {
        let n = readings.as_array().map_or(1, Vec::len);
        let (s, body) = self.post("/v1/readings", readings).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["accepted"], n, "{body}");
    }

    /// Notifications matching a query string, all pages.
    pub async fn notifications(&self, query: &str) -> Vec<Value> {
        let (s, body) = self
            .get(&format!("/v1/notifications?limit=1000&{query}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        body["items"].as_array().unwrap().clone()
    }
}

/// Fresh ids, so tests never collide even on a shared backend.
pub fn unique(prefix: &str) -> String {
    let u = ulid::Ulid::new().to_string();
    format!("{prefix}{}", &u[u.len() - 10..])
}

/// Polls `f` until it returns `Some`, or fails the test after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

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

#[derive(Default)]
struct ReceiverState {
    got: Vec<Received>,
    script: VecDeque<Answer>,
    default: Option<Answer>,
    inflight: HashMap<String, u32>,
    max_inflight_per_sensor: u32,
    inflight_total: u32,
    max_inflight_total: u32,
}

/// A local webhook receiver: records every request, answers from a script, then with a
/// default (200 unless changed).
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<ReceiverState>>,
}

impl Receiver {
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(ReceiverState::default()));
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, state }
    }

    /// Answers these first, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state.lock().unwrap().script.extend(answers);
    }

    /// Answers this once the script is used up.
    pub fn always(&self, answer: Answer) {
        self.state.lock().unwrap().default = Some(answer);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().got.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().got.len()
    }

    pub fn max_inflight_per_sensor(&self) -> u32 {
        self.state.lock().unwrap().max_inflight_per_sensor
    }

    /// Most requests it was answering at once.
    pub fn max_inflight(&self) -> u32 {
        self.state.lock().unwrap().max_inflight_total
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for(&self, n: usize, secs: u64) -> Vec<Received> {
        eventually(secs, &format!("{n} webhook requests"), || async {
            let got = self.received();
            (got.len() >= n).then_some(got)
        })
        .await
    }
}

async fn receive(
    State(state): State<Arc<Mutex<ReceiverState>>>,
    headers: HeaderMap,
    raw: Bytes,
) -> (StatusCode, HeaderMap) {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let sensor = body["sensor"]["id"].as_str().unwrap_or("").to_string();
    let answer = {
        let mut st = state.lock().unwrap();
        st.got.push(Received {
            headers: headers.clone(),
            body,
            raw,
            at: Instant::now(),
        });
        let n = st.inflight.entry(sensor.clone()).or_default();
        *n += 1;
        let n = *n;
        st.max_inflight_per_sensor = st.max_inflight_per_sensor.max(n);
        st.inflight_total += 1;
        st.max_inflight_total = st.max_inflight_total.max(st.inflight_total);
        st.script
            .pop_front()
            .or(st.default)
            .unwrap_or(Answer::status(200))
    };
    // Counted out even when the sender hangs up mid-answer (a killed node): the handler is
    // then dropped, and the guard still runs.
    struct Out(Arc<Mutex<ReceiverState>>, String);
    impl Drop for Out {
        fn drop(&mut self) {
            let mut st = self.0.lock().unwrap_or_else(|p| p.into_inner());
            *st.inflight.entry(std::mem::take(&mut self.1)).or_default() -= 1;
            st.inflight_total -= 1;
        }
    }
    let _out = Out(state.clone(), sensor);
    tokio::time::sleep(answer.delay).await;
    let mut h = HeaderMap::new();
    if let Some(s) = answer.retry_after {
        h.insert("retry-after", s.to_string().parse().unwrap());
    }
    (StatusCode::from_u16(answer.status).unwrap(), h)
}

/// Whether a test may skip for want of a local service: never in CI, where every service
/// the tests need must be running and a missing one fails the run.
pub fn service_missing(service: &str, error: impl std::fmt::Display) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{service} is required in CI and not reachable: {error}");
    }
    eprintln!("SKIPPED: {service} not reachable ({error}); CI runs this test.");
    true
}

/// The PostgreSQL URL the integration tests run on when `TEST_STORE=postgres`. `None`:
/// the embedded SQLite store.
pub async fn database_url(dir: &Path) -> Option<String> {
    if std::env::var("TEST_STORE").ok().as_deref() != Some("postgres") {
        return None;
    }
    Some(
        postgres_url(dir)
            .await
            .unwrap_or_else(|e| panic!("TEST_STORE=postgres but no PostgreSQL: {e}")),
    )
}

/// A PostgreSQL URL with one schema per data folder (so a restart on the same folder finds
/// its data), created on first use.
pub async fn postgres_url(dir: &Path) -> Result<String, tokio_postgres::Error> {
    let base = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    let schema = format!("latch_it_{:016x}", h.finish());
    let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    Ok(format!("{base}{sep}options=-c%20search_path%3D{schema}"))
}
