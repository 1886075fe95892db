//! A `kill -9` in the middle of a stream of readings: after the restart every sensor's
//! state is what its acknowledged readings give. On SQLite a reading that changes nothing
//! but its sensor's `last_ts` and `last_seen_at` is written into the sensor's row at most
//! once a second (`store/sqlite/seen.rs`), so the kill leaves rows older than the readings
//! answered 202, and the start must take the journal's readings back into them before it
//! serves anything. PostgreSQL writes every state at once; the test holds it to the same.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use latch::domain::time;
use serde_json::{Value, json};

use crate::utils::{Process, unique};

/// The state a sensor's acknowledged readings give, by the change rule
/// (`engine::rules::apply`): a reading older than the last applied one is late and
/// changes nothing but when the sensor was last seen.
#[derive(Debug, Default, Clone, Copy)]
struct Expected {
    data: Option<u8>,
    changed_at: Option<i64>,
    last_ts: Option<i64>,
    readings: usize,
}

impl Expected {
    fn apply(&mut self, data: u8, ts: i64) {
        self.readings += 1;
        if self.last_ts.is_some_and(|last| ts < last) {
            return;
        }
        self.last_ts = Some(ts);
        if self.data != Some(data) {
            self.data = Some(data);
            self.changed_at = Some(ts);
        }
    }
}

/// Every reading of a sensor through the API, page by page.
async fn history(http: &reqwest::Client, base: &str, sensor: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/sensors/{sensor}/readings?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let body: Value = http.get(url).send().await.unwrap().json().await.unwrap();
        out.extend(body["items"].as_array().unwrap().iter().cloned());
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

/// `GET /v1/sensors/{id}`.
async fn sensor(http: &reqwest::Client, base: &str, id: &str) -> Value {
    let url = format!("{base}/v1/sensors/{id}");
    http.get(url).send().await.unwrap().json().await.unwrap()
}

fn millis(v: &Value) -> Option<i64> {
    v.as_str().map(|s| time::parse(s).unwrap())
}

/// Sends one round: a reading of each sensor, answered 202 for all, and applies them to
/// `expected`. Device times are a second a round from a fixed past day; every fifth reading
/// of a sensor is late, and a sensor's value changes every seventh round: most readings
/// are repeats.
async fn send_round(
    http: &reqwest::Client,
    base: &str,
    sensors: &[String],
    round: i64,
    expected: &mut HashMap<String, Expected>,
) {
    let t0 = time::parse("2026-11-01T00:00:00Z").unwrap();
    let mut sent = Vec::new();
    for (i, id) in sensors.iter().enumerate() {
        let late = round > 2 && (round + i as i64) % 5 == 0;
        let ts = t0 + round * 1_000 - if late { 1_500 } else { 0 };
        let data = (((round + i as i64) / 7) % 2) as u8;
        sent.push((id, data, ts));
    }
    let body: Vec<Value> = sent
        .iter()
        .map(|(id, data, ts)| json!({"sensor_id": id, "data": data, "ts": time::format(*ts)}))
        .collect();
    let r = http
        .post(format!("{base}/v1/readings"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let ack: Value = r.json().await.unwrap();
    assert_eq!(ack["accepted"], sensors.len());
    for (id, data, ts) in sent {
        expected.entry(id.clone()).or_default().apply(data, ts);
    }
}

/// SQLite: sensors whose row in the file is older than their last reading in the journal.
fn stale_rows(dir: &std::path::Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("latch.db")).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c.query_row(
        "SELECT COUNT(*) FROM sensor_state st WHERE st.last_seen_at < \
         (SELECT max(received_at) FROM readings r WHERE r.sensor_id = st.sensor_id)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test]
async fn kill_9_mid_stream_leaves_every_sensor_as_its_acknowledged_readings_give() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let url = crate::utils::database_url(dir.path()).await;
    let p = Process::start(dir.path(), url.clone());
    p.ready(&http).await;
    let sensors: Vec<String> = (0..40).map(|_| unique("cs")).collect();
    for id in &sensors {
        let r = http
            .post(format!("{}/v1/sensors", p.base))
            .json(&json!({"id": id, "address": "a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut expected: HashMap<String, Expected> = HashMap::new();
    let started = Instant::now();
    let mut round = 0i64;
    // One request at a time, each answered before the next: when the kill comes, every
    // reading sent was acknowledged. It comes well past the first flush and a fraction of
    // a second after the last.
    while started.elapsed() < Duration::from_millis(2_700) {
        round += 1;
        send_round(&http, &p.base, &sensors, round, &mut expected).await;
    }
    // On SQLite, until the file holds rows older than the readings answered (a flush
    // writes them all; the next request after it is kept): the kill then leaves them so.
    if url.is_none() {
        while stale_rows(dir.path()) == 0 {
            round += 1;
            send_round(&http, &p.base, &sensors, round, &mut expected).await;
        }
    }
    assert!(round > 10, "only {round} rounds were sent");
    p.kill9();

    let p = Process::start(dir.path(), url);
    p.ready(&http).await;
    for id in &sensors {
        let want = expected[id];
        let got = sensor(&http, &p.base, id).await;
        let status = &got["status"];
        let readings = history(&http, &p.base, id).await;
        assert_eq!(readings.len(), want.readings, "{id}: every reading kept");
        let last_seen = readings
            .iter()
            .filter_map(|r| millis(&r["received_at"]))
            .max();
        assert_eq!(
            (
                status["data"].as_u64().map(|d| d as u8),
                millis(&status["changed_at"]),
                millis(&status["last_seen_at"]),
                status["connection"].as_str(),
            ),
            (want.data, want.changed_at, last_seen, Some("online")),
            "{id}: the state its acknowledged readings give"
        );
        // The late-reading check reads `last_ts`: a reading just before the last applied
        // one, of the other value, is late and changes nothing.
        let last_ts = want.last_ts.unwrap();
        let other = 1 - want.data.unwrap();
        let r = http
            .post(format!("{}/v1/readings", p.base))
            .json(&json!({"sensor_id": id, "data": other, "ts": time::format(last_ts - 1)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let after = sensor(&http, &p.base, id).await;
        assert_eq!(
            after["status"]["data"].as_u64().map(|d| d as u8),
            want.data,
            "{id}: a reading older than its last applied one is late after the restart"
        );
    }
    p.kill9();
}
