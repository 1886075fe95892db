//! Test harness: the real latch service on a port-0 listener with a JSON HTTP client, on
//! the kit `latch bench` shares ([`latch_testkit`]: the in-process server, webhook
//! receivers that record what they get and answer as told, PostgreSQL schemas).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use latch::clock::Clock;
use latch::config::Config;
use latch_testkit::{PgSchema, Server};
use serde_json::{Value, json};

// tests/pg_restart.rs shares this module and uses none of these.
#[allow(unused_imports)]
pub use latch_testkit::{Answer, Received, Receiver, eventually};

pub mod brokers;
pub mod cluster;
pub mod fault;
pub mod mosquitto;
mod process;
pub mod proxy;
pub mod receivers;
pub mod site_fleet;
pub mod subscriber;

#[allow(unused_imports)]
pub use process::{Process, with_umask};

/// A running latch, stopped gracefully by [`TestServer::stop`].
pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub dir: PathBuf,
    _tmp: Option<Arc<tempfile::TempDir>>,
    token: Option<String>,
    server: Option<Server>,
}

/// The key every latch of the tests that share a PostgreSQL database seals secrets with
/// (`LATCH_SECRET_KEY`); the embedded store's tests use the data folder's own key file.
pub const TEST_SECRET_KEY: [u8; 32] = [7; 32];

/// [`TEST_SECRET_KEY`] as `LATCH_SECRET_KEY` is written.
pub fn test_secret_key() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(TEST_SECRET_KEY)
}

/// Settings most tests want: quick retries, quick timeouts, and the receivers (all on
/// 127.0.0.1) let through the SSRF guard. Tests of the guard itself clear the allow list.
pub fn fast_config(dir: &Path) -> Config {
    let mut c = Config::for_data_dir(dir);
    c.delivery_allow_nets = vec!["127.0.0.0/8".parse().unwrap()];
    c.sqlite_synchronous = latch::store::sqlite::Synchronous::Normal;
    c.retry_base = Duration::from_millis(200);
    c.retry_max_delay = Duration::from_secs(5);
    c.delivery_timeout = Duration::from_secs(2);
    c.shutdown_grace = Duration::from_secs(3);
    // No cluster exchange unless a test names one of its own: tests share one broker.
    c.amqp_exchange = String::new();
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
        Self::start_clocked(dir, tweak, Clock::wall()).await
    }

    /// Starts on `dir` with `clock`: a test holding a manual clock moves time itself
    /// ([`Clock::advance`]) instead of sleeping through timeouts and retry delays.
    pub async fn start_clocked(dir: &Path, tweak: impl FnOnce(&mut Config), clock: Clock) -> Self {
        let mut config = test_config(dir).await;
        tweak(&mut config);
        // Servers sharing a database share its key, as a cluster's nodes must.
        if config.database_url.is_some() && config.secret_key.is_none() {
            config.secret_key = Some(latch::secrets::SecretKeys(vec![TEST_SECRET_KEY]));
        }
        let token = config.api_token.clone();
        let server = Server::start_on(config, Duration::from_secs(10), clock)
            .await
            .expect("latch starts");
        Self {
            base: server.base.clone(),
            http: reqwest::Client::new(),
            dir: dir.to_path_buf(),
            _tmp: None,
            token,
            server: Some(server),
        }
    }

    /// Graceful stop; returns the data folder's owner so a restart can reuse it.
    pub async fn stop(mut self) -> Option<Arc<tempfile::TempDir>> {
        if let Some(server) = self.server.take() {
            server.stop().await.expect("latch stops cleanly");
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

    /// Asserts that a sensor created with `field` set to each value is refused (422), its
    /// message naming what is wrong (the value's `why`).
    pub async fn sensor_refused(&self, field: &str, cases: &[(Value, &str)]) {
        for (value, why) in cases {
            let (s, body) = self
                .post(
                    "/v1/sensors",
                    json!({"id": unique("bad"), "address": "x", field: value}),
                )
                .await;
            assert_eq!(
                s,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{field} {value}: {body}"
            );
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains(why), "{field} {value}: {message}");
        }
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

    /// Returns once every engine shard has run a round at the clock's current time: a
    /// round declares every sensor due by then lost and commits it before it answers,
    /// so what has not happened by now did not happen at this time. Readings of unknown
    /// sensors go through every shard (each is judged there) and change nothing; 64 of
    /// them reach each of the shards (hashed by id) all but surely.
    pub async fn engine_round(&self) {
        let probes: Vec<Value> = (0..64)
            .map(|i| json!({"sensor_id": format!("probe{i}x{}", &unique("p")[..6]), "data": 1}))
            .collect();
        let (s, body) = self.post("/v1/readings", Value::Array(probes)).await;
        // Nothing of it is accepted: 422, with what became of each.
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["accepted"], 0, "probes are unknown sensors: {body}");
    }

    /// Returns once the dispatcher has taken up everything committed before the call, at
    /// the clock's current time: a probe notification, committed after them, is delivered
    /// to a receiver of its own and recorded. The dispatcher takes notifications in commit
    /// order and sends what is due in the same round, so an attempt that was going to
    /// start by now has started; its answer comes from a local receiver within moments.
    pub async fn dispatcher_round(&self) {
        let probe = Receiver::start().await;
        let sensor = unique("probe");
        self.sensor(&sensor).await;
        let client = self.client(&probe.url).await;
        self.link(&client, &sensor).await;
        self.readings(json!({"sensor_id": sensor, "data": 1})).await;
        probe.wait_for(1, 10).await;
        eventually(10, "the probe's delivery recorded", || async {
            let done = self
                .notifications(&format!("sensor_id={sensor}&status=delivered"))
                .await;
            (!done.is_empty()).then_some(())
        })
        .await;
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

/// The settings a [`TestServer`] on `dir` starts with before a test's own: [`fast_config`]
/// on the store under test. A test may prepare that store with them before it starts.
/// Waits until `counter` has grown by `n` from now while `task`, which counts, runs: a task
/// that ended fails the wait at once.
pub async fn grows_by<T>(
    counter: &AtomicUsize,
    n: usize,
    task: &tokio::task::JoinHandle<T>,
    what: &str,
) {
    let want = counter.load(Ordering::SeqCst) + n;
    eventually(30, what, || async {
        assert!(!task.is_finished(), "{what}: the task counting them ended");
        (counter.load(Ordering::SeqCst) >= want).then_some(())
    })
    .await;
}

pub async fn test_config(dir: &Path) -> Config {
    let mut config = fast_config(dir);
    config.database_url = database_url(dir).await;
    if config.database_url.is_some() {
        config.secret_key = Some(latch::secrets::SecretKeys(vec![TEST_SECRET_KEY]));
    }
    config
}

/// Fresh ids, so tests never collide even on a shared backend.
pub fn unique(prefix: &str) -> String {
    let u = ulid::Ulid::new().to_string();
    format!("{prefix}{}", &u[u.len() - 10..])
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
    Ok(
        PgSchema::ensure(&base, &format!("latch_it_{:016x}", h.finish()))
            .await?
            .url,
    )
}

/// A server on loopback answering every request with `status` and `Location: location`.
pub async fn redirecting(status: u16, location: &str) -> String {
    let location = location.to_string();
    let app = axum::Router::new().fallback(move || {
        let location = location.clone();
        async move {
            (
                StatusCode::from_u16(status).unwrap(),
                [(axum::http::header::LOCATION, location)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A server on loopback counting every request it gets, whatever its method, answering
/// 200; its URL ends in `path`.
pub async fn counting(path: &str) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{path}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}
