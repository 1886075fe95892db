//! A cluster of real `latch serve` processes on one fresh PostgreSQL schema, a producer that
//! keeps readings flowing through every node and sends again what was refused, and the
//! checks that what the cluster stored and delivered is what one node gives for the same
//! readings.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latch::domain::partition::{Partitioning, Scheme};
use latch::domain::time;
use serde_json::{Value, json};

use super::{Process, Receiver, eventually, service_missing};

/// The lease the nodes hold their partitions with: short, so takeovers fit in a test.
pub const LEASE: Duration = Duration::from_secs(2);
/// Partitions of a test cluster's schema.
pub const PARTITIONS: u32 = 16;

/// One node: its data folder (which keeps its node id) and the process, once started.
pub struct Node {
    pub base: String,
    pub process: Option<Process>,
    dir: tempfile::TempDir,
}

/// Nodes on one schema. Processes are killed when it is dropped.
pub struct Cluster {
    pub url: String,
    pub http: reqwest::Client,
    pub nodes: Vec<Node>,
    env: Vec<(&'static str, String)>,
    _schema_dir: tempfile::TempDir,
}

impl Cluster {
    /// `n` nodes on a fresh schema, ready and with the partitions spread; `None` when the
    /// test does not run here: in the PostgreSQL pass (it always uses PostgreSQL, so it runs
    /// once, in the first), or without PostgreSQL outside CI.
    pub async fn start(n: usize) -> Option<Self> {
        Self::start_env(n, &[]).await
    }

    /// As [`Cluster::start`], with more `LATCH_*` settings on every node.
    pub async fn start_env(n: usize, env: &[(&'static str, String)]) -> Option<Self> {
        let c = Self::start_spread(n, env).await?;
        // `GET /v1/cluster` reads the leases; each node routes by them from its next round
        // (a third of the lease). A lease later every node has, and nothing is moving.
        tokio::time::sleep(LEASE).await;
        Some(c)
    }

    /// As [`Cluster::start_env`], but back as soon as `GET /v1/cluster` shows the spread,
    /// while the nodes may still be taking their partitions up.
    pub async fn start_spread(n: usize, env: &[(&'static str, String)]) -> Option<Self> {
        Self::start_prepared(n, env, |_| async {}).await
    }

    /// As [`Cluster::start_spread`], once `prepare` has had the fresh schema (given the
    /// settings the nodes share) before any node starts: a fleet imported in bulk.
    pub async fn start_prepared<F, Fut>(
        n: usize,
        env: &[(&'static str, String)],
        prepare: F,
    ) -> Option<Self>
    where
        F: FnOnce(latch::config::Config) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
            return None;
        }
        let schema_dir = tempfile::tempdir().unwrap();
        let url = match super::postgres_url(schema_dir.path()).await {
            Ok(u) => u,
            Err(e) => {
                service_missing("PostgreSQL", e);
                return None;
            }
        };
        let mut shared = latch::config::Config::for_data_dir(&schema_dir.path().join("prepare"));
        shared.database_url = Some(url.clone());
        shared.secret_key = Some(latch::secrets::SecretKeys(vec![super::TEST_SECRET_KEY]));
        shared.cluster_partitions = Some(PARTITIONS);
        prepare(shared).await;
        let mut all = vec![
            ("LATCH_CLUSTER_LEASE", format!("{}s", LEASE.as_secs())),
            ("LATCH_CLUSTER_PARTITIONS", PARTITIONS.to_string()),
            ("LATCH_CLUSTER_SECRET", "it-cluster-secret".to_string()),
        ];
        all.extend(env.iter().cloned());
        // A cluster with a bootstrap token is called with it.
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some((_, token)) = env.iter().find(|(k, _)| *k == "LATCH_API_TOKEN") {
            let value = format!("Bearer {token}").parse().unwrap();
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut c = Self {
            url,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .default_headers(headers)
                .build()
                .unwrap(),
            nodes: Vec::new(),
            env: all,
            _schema_dir: schema_dir,
        };
        for _ in 0..n {
            c.add().await;
        }
        c.balanced(n, 20).await;
        Some(c)
    }

    /// Starts one more node and waits until it is ready; returns its index.
    pub async fn add(&mut self) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let p = Process::start_env(dir.path(), Some(self.url.clone()), &self.env);
        p.ready(&self.http).await;
        self.nodes.push(Node {
            base: p.base.clone(),
            process: Some(p),
            dir,
        });
        self.nodes.len() - 1
    }

    pub fn base(&self, i: usize) -> &str {
        &self.nodes[i].base
    }

    fn process(&self, i: usize) -> &Process {
        self.nodes[i].process.as_ref().expect("node running")
    }

    /// The addresses of the nodes still running.
    pub fn live(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.process.is_some())
            .map(|n| n.base.clone())
            .collect()
    }

    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].process.take().expect("node running").kill9();
    }

    /// SIGTERM; `true` when the node exited with success.
    pub async fn terminate(&mut self, i: usize) -> bool {
        let p = self.nodes[i].process.take().expect("node running");
        p.terminate().await
    }

    pub fn pause(&self, i: usize) {
        self.process(i).pause();
    }

    pub fn resume(&self, i: usize) {
        self.process(i).resume();
    }

    pub async fn get(&self, base: &str, path: &str) -> Value {
        let resp = self
            .http
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {base}{path}: {e}"));
        assert!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    pub async fn post(&self, base: &str, path: &str, body: Value) -> Value {
        let resp = self
            .http
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "POST {path}: {status} {body}");
        body
    }

    pub async fn put(&self, base: &str, path: &str) {
        let resp = self.http.put(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 204, "PUT {path}");
    }

    /// `GET /v1/cluster` as node `via` sees it; `None` when it does not answer.
    pub async fn view(&self, via: &str) -> Option<Value> {
        let resp = self
            .http
            .get(format!("{via}/v1/cluster"))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    /// How the cluster maps sensors to partitions, as `GET /v1/cluster` says.
    pub async fn partitioning(&self) -> Partitioning {
        let view = self.get(&self.live()[0], "/v1/cluster").await;
        let scheme = view["partitioning"].as_str().and_then(Scheme::parse);
        let count = view["partitions"].as_u64().map(|n| n as u32);
        match (scheme, count) {
            (Some(scheme), Some(count)) => Partitioning { count, scheme },
            _ => panic!("GET /v1/cluster names no partitioning: {view}"),
        }
    }

    /// Waits up to `secs` until every running node sees exactly the `n` running nodes, all
    /// partitions held, each node `floor(P/n)` or `ceil(P/n)` of them.
    pub async fn balanced(&self, n: usize, secs: u64) -> Value {
        let live = self.live();
        assert_eq!(live.len(), n, "{n} nodes running");
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let mut views = Vec::new();
            for via in &live {
                views.push(self.view(via).await.unwrap_or(Value::Null));
            }
            if views.iter().all(|v| spread_over(v, &live)) {
                return views.swap_remove(0);
            }
            assert!(
                Instant::now() < deadline,
                "partitions not spread over {live:?} within {secs}s; the nodes see {views:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Which running node (its index in [`Cluster::live`]) owns `sensor`'s partition: the
    /// one a reading of it, `data`, sent through it does not leave.
    pub async fn owner_of(&self, sensor: &str, data: u8) -> usize {
        for (i, base) in self.live().iter().enumerate() {
            let before = self.metric("latch_cluster_forwarded_readings_total").await;
            let one = vec![json!({"sensor_id": sensor, "data": data})];
            post_until_accepted(&self.http, std::slice::from_ref(base), one, 10).await;
            if self.metric("latch_cluster_forwarded_readings_total").await == before {
                return i;
            }
        }
        panic!("no node owns {sensor}'s partition")
    }

    /// Sum of a metric over the running nodes.
    pub async fn metric(&self, name: &str) -> f64 {
        let mut sum = 0.0;
        for base in self.live() {
            sum += self.node_metric(&base, name).await;
        }
        sum
    }

    pub async fn node_metric(&self, base: &str, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        latch_bench::metric_sum(&text, name)
    }

    /// A client for `url` and `n` sensors, each registered and linked through a different
    /// node than the one before (registration through any node counts on all).
    pub async fn fleet(
        &self,
        prefix: &str,
        n: usize,
        url: &str,
        body: Value,
    ) -> (String, Vec<String>) {
        let live = self.live();
        let client = self
            .post(&live[0], "/v1/clients", json!({"name": "c", "url": url}))
            .await["id"]
            .as_str()
            .unwrap()
            .to_string();
        let mut ids = Vec::new();
        for i in 0..n {
            let id = super::unique(prefix);
            let mut sensor = body.clone();
            sensor["id"] = json!(id);
            sensor["address"] = json!("a");
            self.post(&live[i % live.len()], "/v1/sensors", sensor)
                .await;
            self.put(
                &live[(i + 1) % live.len()],
                &format!("/v1/clients/{client}/sensors/{id}"),
            )
            .await;
            ids.push(id);
        }
        (client, ids)
    }
}

/// A failing test shows the end of each node's log.
impl Drop for Cluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for n in &self.nodes {
            let log = std::fs::read_to_string(n.dir.path().join("latch.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!("--- log of {} (last 40 lines) ---\n{tail}", n.base);
        }
    }
}

/// Whether a `GET /v1/cluster` answer lists every node of `live`, all partitions held by
/// them and spread evenly (`floor(P/n)` or `ceil(P/n)` each). A node gone may still be
/// listed until its heartbeat is older than the lease, but holding nothing.
pub fn spread_over(view: &Value, live: &[String]) -> bool {
    let Some(nodes) = view["nodes"].as_array() else {
        return false;
    };
    let n = live.len() as u64;
    let p = u64::from(PARTITIONS);
    let held = |base: &str| {
        nodes
            .iter()
            .find(|node| node["address"] == base)
            .and_then(|node| node["partitions"].as_u64())
    };
    let counts: Option<Vec<u64>> = live.iter().map(|b| held(b)).collect();
    let Some(counts) = counts else {
        return false;
    };
    let gone_hold_nothing = nodes
        .iter()
        .filter(|node| !live.iter().any(|b| node["address"] == b.as_str()))
        .all(|node| node["partitions"] == 0);
    view["partitions"] == p
        && gone_hold_nothing
        && counts.iter().sum::<u64>() == p
        && counts.iter().all(|&c| c == p / n || c == p.div_ceil(n))
}

/// What happened to one posted reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    /// Refused while its partition moves (or the node did not answer): send it again.
    Again,
}

/// Posts readings to `base`: per reading, accepted or to be sent again. Any other refusal
/// (an unknown sensor, a bad reading) fails the test.
pub async fn post_readings(http: &reqwest::Client, base: &str, readings: &[Value]) -> Vec<Outcome> {
    let again = vec![Outcome::Again; readings.len()];
    let Ok(resp) = http
        .post(format!("{base}/v1/readings"))
        .json(&readings)
        .send()
        .await
    else {
        return again;
    };
    let status = resp.status().as_u16();
    let Ok(body) = resp.json::<Value>().await else {
        return again;
    };
    match status {
        202 => {
            let mut out = vec![Outcome::Accepted; readings.len()];
            for r in body["rejected"].as_array().into_iter().flatten() {
                assert_eq!(
                    r["code"],
                    "store_unavailable",
                    "only a move refuses; {base} answered at {}: {body}",
                    time::format(time::now_ms())
                );
                out[r["index"].as_u64().unwrap() as usize] = Outcome::Again;
            }
            let accepted = out.iter().filter(|o| **o == Outcome::Accepted).count();
            assert_eq!(body["accepted"], accepted, "{body}");
            out
        }
        503 => again,
        _ => panic!("POST /v1/readings to {base}: {status} {body}"),
    }
}

/// Sends `readings` through `targets` in turn until every one is accepted; how many
/// requests that took. Panics after `secs`.
pub async fn post_until_accepted(
    http: &reqwest::Client,
    targets: &[String],
    readings: Vec<Value>,
    secs: u64,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut pending = readings;
    let mut requests = 0;
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} readings not accepted within {secs}s",
            pending.len()
        );
        let base = &targets[requests % targets.len()];
        requests += 1;
        let out = post_readings(http, base, &pending).await;
        pending = pending
            .into_iter()
            .zip(out)
            .filter(|(_, o)| *o == Outcome::Again)
            .map(|(r, _)| r)
            .collect();
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    requests
}

/// The value sensor `i` reports in round `r`: a fixed pseudo-random bit, so about half of
/// the readings change their sensor's state.
pub fn value(i: usize, r: usize) -> u8 {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (r as u64 + 7).wrapping_mul(0x2545_F491);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x & 1) as u8
}

/// Readings sent per sensor, in the order they were accepted (which is their `ts` order).
pub type Sent = HashMap<String, Vec<(i64, u8)>>;

/// A producer sending rounds of readings (one per sensor, `ts` one second after the
/// round before) through the nodes in `targets`, each request to the next node. A round
/// starts only when every reading of the one before was accepted, so each sensor's
/// readings are applied in order whatever was refused and sent again.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// The nodes it sends to; a test changes it as nodes come and go.
    pub targets: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<(Sent, usize)>,
}

impl Load {
    pub fn start(http: reqwest::Client, sensors: Vec<String>, targets: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let targets = Arc::new(Mutex::new(targets));
        let (s, t) = (stop.clone(), targets.clone());
        let task = tokio::spawn(async move {
            let base = time::now_ms() - 3_600_000;
            let mut sent: Sent = HashMap::new();
            let mut rounds = 0;
            while !s.load(Ordering::SeqCst) {
                let round: Vec<Value> = sensors
                    .iter()
                    .enumerate()
                    .map(|(i, id)| reading(id, value(i, rounds), base + rounds as i64 * 1000))
                    .collect();
                for chunk in round.chunks(10) {
                    let targets = rotate(&t.lock().unwrap(), rounds);
                    post_until_accepted(&http, &targets, chunk.to_vec(), 40).await;
                }
                for (i, id) in sensors.iter().enumerate() {
                    sent.entry(id.clone())
                        .or_default()
                        .push((base + rounds as i64 * 1000, value(i, rounds)));
                }
                rounds += 1;
            }
            (sent, rounds)
        });
        Self {
            stop,
            targets,
            task,
        }
    }

    /// Ends the round under way and returns what was accepted, and in how many rounds.
    pub async fn stop(self) -> (Sent, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the producer did not fail")
    }
}

/// `targets` starting at `by` (mod len): consecutive requests go to different nodes.
fn rotate(targets: &[String], by: usize) -> Vec<String> {
    let mut t = targets.to_vec();
    if !t.is_empty() {
        let k = by % t.len();
        t.rotate_left(k);
    }
    t
}

pub fn reading(id: &str, data: u8, ts: i64) -> Value {
    json!({"sensor_id": id, "data": data, "ts": time::format(ts)})
}

/// The state changes one node makes of a sensor's readings in order: `(data, previous)`.
pub fn transitions(readings: &[(i64, u8)]) -> Vec<(u8, Option<u8>)> {
    let mut prev = None;
    let mut out = Vec::new();
    for &(_, d) in readings {
        if prev != Some(d) {
            out.push((d, prev));
            prev = Some(d);
        }
    }
    out
}

fn pair(v: &Value) -> (u8, Option<u8>) {
    (
        v["data"].as_u64().expect("data") as u8,
        v["previous"].as_u64().map(|p| p as u8),
    )
}

/// Checks through node `via` that the store holds, per sensor, exactly the accepted
/// readings and the state changes one node makes of them, that every notification ended
/// delivered or superseded, and that the receiver got them in order per sensor, a repeat
/// only as a retry with the same `webhook-id`.
pub async fn check_consistent(c: &Cluster, via: &str, client: &str, sent: &Sent, r: &Receiver) {
    for (id, readings) in sent {
        // History: each accepted reading, nothing else (a reading sent again after an
        // answer that was lost may be stored twice, with its own `ts`).
        let hist = c
            .get(via, &format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        let stored: HashSet<(i64, u8)> = hist["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                let ts = time::parse(h["ts"].as_str().unwrap()).unwrap();
                (ts, h["data"].as_u64().unwrap() as u8)
            })
            .collect();
        let want: HashSet<(i64, u8)> = readings.iter().copied().collect();
        assert_eq!(
            stored, want,
            "sensor {id}: the readings in history are those accepted"
        );

        let events = c
            .get(via, &format!("/v1/sensors/{id}/events?limit=1000"))
            .await;
        let changes: Vec<(u8, Option<u8>)> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                assert_eq!(e["type"], "sensor.state_changed", "sensor {id}: {e}");
                pair(e)
            })
            .collect();
        let expected = transitions(readings);
        assert_eq!(changes, expected, "sensor {id}: its events are one node's");
        let sensor = c.get(via, &format!("/v1/sensors/{id}")).await;
        assert_eq!(
            sensor["status"]["data"],
            readings.last().unwrap().1,
            "sensor {id}: {sensor}"
        );
    }

    // Every notification settles: delivered, or superseded by a newer one.
    let all = eventually(30, "every notification delivered or superseded", || async {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let q = cursor
                .as_ref()
                .map_or(String::new(), |c| format!("&cursor={c}"));
            let page = c
                .get(
                    via,
                    &format!("/v1/notifications?client_id={client}&limit=1000{q}"),
                )
                .await;
            all.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(n) => cursor = Some(n.to_string()),
                None => break,
            }
        }
        all.iter()
            .all(|n| n["status"] == "delivered" || n["status"] == "superseded")
            .then_some(all)
    })
    .await;
    let mut by_sensor: HashMap<&str, Vec<&Value>> = HashMap::new();
    for n in &all {
        by_sensor
            .entry(n["sensor_id"].as_str().unwrap())
            .or_default()
            .push(n);
    }
    let mut position: HashMap<String, (String, usize)> = HashMap::new();
    for (id, readings) in sent {
        let mut ns = by_sensor.remove(id.as_str()).unwrap_or_default();
        ns.sort_by_key(|n| time::parse(n["occurred_at"].as_str().unwrap()));
        let got: Vec<(u8, Option<u8>)> = ns.iter().map(|n| pair(n)).collect();
        assert_eq!(
            got,
            transitions(readings),
            "sensor {id}: one notification per change"
        );
        assert_eq!(
            ns.last().map(|n| n["status"].clone()),
            Some(json!("delivered")),
            "sensor {id}: the newest state is delivered"
        );
        for (k, n) in ns.iter().enumerate() {
            position.insert(n["id"].as_str().unwrap().to_string(), (id.clone(), k));
        }
    }
    assert!(
        by_sensor.is_empty(),
        "notifications of sensors never sent to"
    );

    let received = r.received();
    let mut last: HashMap<String, usize> = HashMap::new();
    let mut seen: HashMap<String, Value> = HashMap::new();
    for g in &received {
        let nid = g.body["id"].as_str().unwrap().to_string();
        assert_eq!(
            g.headers["webhook-id"].to_str().unwrap(),
            nid,
            "webhook-id is the notification id"
        );
        let (sensor, k) = position
            .get(&nid)
            .unwrap_or_else(|| {
                panic!(
                    "received a notification the store does not hold: {}",
                    g.body
                )
            })
            .clone();
        let before = last.insert(sensor.clone(), k).unwrap_or(0);
        assert!(
            k >= before,
            "sensor {sensor}: an older state arrived after a newer one ({k} after {before})"
        );
        if let Some(first) = seen.get(&nid) {
            assert_eq!(first, &g.body, "a repeat carries the same notification");
        }
        seen.insert(nid, g.body.clone());
    }
    for n in &all {
        if n["status"] == "delivered" {
            assert!(
                seen.contains_key(n["id"].as_str().unwrap()),
                "delivered but never received: {n}"
            );
        }
    }
}
