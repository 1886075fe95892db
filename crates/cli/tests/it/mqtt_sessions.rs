//! MQTT readings that committed but were never acknowledged are not applied again after
//! latch stops and starts (SIGTERM, then a new process): the broker resends them with their
//! packet ids to the next session, which must still know them. A real Mosquitto of the
//! test's own (with persistence, so its sessions survive its restarts), the real `latch`
//! binary, and PostgreSQL behind a proxy that holds a commit's answer, so that the
//! connection to the broker can be lost while the commit lands.

use std::path::Path;

use serde_json::{Value, json};

use crate::utils::mosquitto::Mosquitto;
use crate::utils::proxy::{Proxy, Target};
use crate::utils::{Process, Receiver, eventually, unique};

/// latch's settings for the broker on `port` and the database at `url` (through a proxy).
fn env(port: u16, client_id: &str, prefix: &str, url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LATCH_DATABASE_URL", url.to_string()),
        ("LATCH_SECRET_KEY", crate::utils::test_secret_key()),
        ("LATCH_DATABASE_TIMEOUT", "1s".to_string()),
        (
            "LATCH_MQTT_URL",
            format!("mqtt://127.0.0.1:{port}?client_id={client_id}"),
        ),
        ("LATCH_MQTT_TOPIC", format!("{prefix}/+/state")),
    ]
}

async fn get(http: &reqwest::Client, p: &Process, path: &str) -> Value {
    let r = http.get(format!("{}{path}", p.base)).send().await.unwrap();
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().await.unwrap()
}

async fn post(http: &reqwest::Client, p: &Process, path: &str, body: Value) -> Value {
    let r = http
        .post(format!("{}{path}", p.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "POST {path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

/// The readings in a sensor's history.
async fn history(http: &reqwest::Client, p: &Process, id: &str) -> Vec<Value> {
    let h = get(http, p, &format!("/v1/sensors/{id}/readings?limit=1000")).await;
    h["items"].as_array().unwrap().clone()
}

/// Starts latch on `dir` and waits until it is ready (subscribed).
async fn latch(dir: &Path, env: &[(&'static str, String)], http: &reqwest::Client) -> Process {
    let p = Process::start_env(dir, None, env);
    p.ready(http).await;
    p
}

/// A latch process on PostgreSQL through a proxy that holds a commit's answer, subscribed
/// to a Mosquitto of its own, with a sensor linked to a receiver.
struct Setup {
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    broker: Mosquitto,
    proxy: Proxy,
    env: Vec<(&'static str, String)>,
    http: reqwest::Client,
    /// Where the sensor's notifications go (kept for the test's life).
    _receiver: Receiver,
    id: String,
    topic: String,
}

impl Setup {
    /// `None` where the test does not run (the PostgreSQL pass, or no PostgreSQL or
    /// Mosquitto outside CI).
    async fn start() -> Option<(Self, Process)> {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let (url, upstream) = crate::store_faults::postgres(dir.path()).await?;
        let broker = Mosquitto::start(&[]).await?;
        let proxy = Proxy::start(upstream.clone(), Target::PgCommitAnswer).await;
        let proxied = url.replacen(&upstream, &proxy.addr, 1);
        let prefix = unique("ms");
        let env = env(broker.port, &unique("latch"), &prefix, &proxied);
        let http = reqwest::Client::new();
        let p = latch(&data, &env, &http).await;
        let receiver = Receiver::start().await;
        let id = unique("ms");
        post(&http, &p, "/v1/sensors", json!({"id": id, "address": "a"})).await;
        let client = post(
            &http,
            &p,
            "/v1/clients",
            json!({"name": "c", "url": receiver.url}),
        )
        .await;
        let client = client["id"].as_str().unwrap();
        let link = http
            .put(format!("{}/v1/clients/{client}/sensors/{id}", p.base))
            .send()
            .await
            .unwrap();
        assert!(link.status().is_success());
        let topic = format!("{prefix}/{id}/state");
        let s = Self {
            _dir: dir,
            data,
            broker,
            proxy,
            env,
            http,
            _receiver: receiver,
            id,
            topic,
        };
        Some((s, p))
    }

    /// Publishes 1 then 0, no `ts` (applied twice, each would change the state again),
    /// and returns once the first one's commit is in flight with its answer held.
    async fn publish_two_and_hold_the_commit(&self) {
        self.proxy.arm_for(&self.id);
        let two = [
            (self.topic.clone(), b"1".to_vec()),
            (self.topic.clone(), b"0".to_vec()),
        ];
        assert!(crate::mqtt::publish_on(self.broker.port, &two, false).await);
        self.proxy.hit(1).await;
    }

    /// Starts latch again on the same folder, waits until the broker's resends (if any)
    /// were judged, and checks that each reading was applied once. The new process.
    async fn each_applied_once(&self) -> Process {
        let (http, id) = (&self.http, &self.id);
        let p = latch(&self.data, &self.env, http).await;
        // Behind the broker's resends: once this one (found by its `ts`) is applied, they
        // were judged.
        let ts = latch::domain::time::format(latch::domain::time::now_ms());
        let marker = json!({"data": 1, "ts": ts}).to_string().into_bytes();
        let sent = [(self.topic.clone(), marker)];
        assert!(crate::mqtt::publish_on(self.broker.port, &sent, false).await);
        eventually(30, "the marker applied", || async {
            let h = history(http, &p, id).await;
            h.iter()
                .any(|r| r["ts"].as_str() == Some(ts.as_str()))
                .then_some(())
        })
        .await;
        let h = history(http, &p, id).await;
        assert_eq!(h.len(), 3, "each reading once: {h:?}");
        let events = get(http, &p, &format!("/v1/sensors/{id}/events?limit=100")).await;
        let changes = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "sensor.state_changed")
            .count();
        assert_eq!(changes, 3, "one state change per reading: {events}");
        // One notification per change (an older one may be superseded by the next).
        let notes = get(http, &p, &format!("/v1/notifications?sensor_id={id}")).await;
        assert_eq!(notes["items"].as_array().unwrap().len(), 3, "{notes}");
        p
    }
}

/// Resends of committed publishes this process recognised (`latch_mqtt_duplicates_total`).
async fn duplicates(http: &reqwest::Client, p: &Process) -> f64 {
    let text = http
        .get(format!("{}/metrics", p.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("latch_mqtt_duplicates_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The two readings commit while latch's connection to the broker is lost, so neither is
/// acknowledged; latch stops (SIGTERM) while the broker is still away. The next latch
/// process meets the broker's resends and knows them: the stop kept them in the store.
#[tokio::test]
async fn publishes_committed_but_unacknowledged_when_latch_stopped_are_not_applied_again() {
    let Some((mut s, p)) = Setup::start().await else {
        return;
    };
    s.publish_two_and_hold_the_commit().await;
    // The broker goes away, saving the session with both publishes unacknowledged.
    s.broker.stop();
    s.proxy.release();
    eventually(30, "both readings committed", || async {
        (history(&s.http, &p, &s.id).await.len() >= 2).then_some(())
    })
    .await;
    assert!(p.terminate().await, "latch stops cleanly");
    s.broker.resume().await;
    let p = s.each_applied_once().await;
    assert!(
        duplicates(&s.http, &p).await >= 2.0,
        "the resends were recognised"
    );
    assert!(p.terminate().await);
}

/// The same, but the broker is back (the connection lost while the commit landed is made
/// again, and the broker resends both publishes to it) when latch is told to stop: the
/// stop acknowledges the resends, so the broker has nothing to resend to the next
/// process.
#[tokio::test]
async fn a_stop_acknowledges_the_resends_of_what_committed() {
    let Some((mut s, p)) = Setup::start().await else {
        return;
    };
    s.publish_two_and_hold_the_commit().await;
    s.broker.restart().await;
    // The commit's answer is still held: latch learns it committed, from the server,
    // while it stops.
    assert!(p.terminate().await, "latch stops cleanly");
    s.proxy.release();
    let p = s.each_applied_once().await;
    assert_eq!(
        duplicates(&s.http, &p).await,
        0.0,
        "nothing was left for the broker to resend"
    );
    assert!(p.terminate().await);
}
