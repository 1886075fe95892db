//! History in ClickHouse: rows ship from the spool, reads merge ClickHouse and the spool,
//! and neither a ClickHouse outage nor a killed latch loses or doubles a row.

use std::sync::Arc;
use std::time::Duration;

use latch::domain::{SensorId, time};
use latch::history::History;
use latch::history::clickhouse::{ClickHouse, Target};
use latch::store::{HistoryBatch, PageRequest, ReadingRecord, Stored, TimeRange};
use latch_bench::clickhouse_server::{LocalClickHouse, query};
use serde_json::{Value, json};

use crate::utils::Process;
use crate::utils::{Answer, Receiver, TestServer, eventually, service_missing, unique};

/// The shared ClickHouse the tests use (`TEST_CLICKHOUSE_URL`, default 127.0.0.1:8123).
async fn shared() -> Option<String> {
    let url =
        std::env::var("TEST_CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into());
    match query(&url, "SELECT 1").await {
        Ok(_) => Some(url),
        Err(e) => {
            service_missing("ClickHouse", e);
            None
        }
    }
}

/// A private ClickHouse this test may stop and start.
async fn private(dir: &std::path::Path) -> Option<LocalClickHouse> {
    match LocalClickHouse::start(dir).await {
        Ok(ch) => Some(ch),
        Err(e) => {
            service_missing("clickhouse-server", e);
            None
        }
    }
}

async fn count(url: &str, sql: &str) -> Option<u64> {
    query(url, sql).await.ok()?.parse().ok()
}

/// Base time of the readings the tests post: a fixed past day.
fn t0() -> i64 {
    time::parse("2026-11-01T00:00:00Z").unwrap()
}

fn at(minute: i64) -> String {
    time::format(t0() + minute * 60_000)
}

/// Every reading of a sensor through the API, page by page.
async fn all_readings(s: &TestServer, sensor: &str, limit: u32) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/sensors/{sensor}/readings?limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, body) = s.get(&path).await;
        assert_eq!(status, 200, "{body}");
        out.extend(body["items"].as_array().unwrap().iter().cloned());
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

#[tokio::test]
async fn readings_events_and_attempts_ship_and_read_back_by_range() {
    let Some(url) = shared().await else { return };
    let db = unique("latch_t_");
    let s = TestServer::start_with(|c| {
        c.clickhouse_url = Some(url.clone());
        c.clickhouse_database = db.clone();
        c.clickhouse_flush = Duration::from_millis(100);
    })
    .await;
    let sensor = unique("h");
    s.sensor(&sensor).await;
    let r = Receiver::start().await;
    r.always(Answer::status(200));
    let client = s.client(&r.url).await;
    s.link(&client, &sensor).await;

    let readings: Vec<Value> = (0..30)
        .map(|i| json!({"sensor_id": sensor, "data": i % 2, "ts": at(i)}))
        .collect();
    s.readings(Value::Array(readings)).await;
    let in_ch = format!("SELECT count() FROM {db}.readings WHERE sensor_id = '{sensor}'");
    eventually(20, "30 readings in ClickHouse", || async {
        (count(&url, &in_ch).await? == 30).then_some(())
    })
    .await;
    let events = format!("SELECT count() FROM {db}.events WHERE sensor_id = '{sensor}'");
    eventually(20, "30 state changes in ClickHouse", || async {
        (count(&url, &events).await? == 30).then_some(())
    })
    .await;

    // Ranges and pages read from ClickHouse.
    let (status, body) = s
        .get(&format!(
            "/v1/sensors/{sensor}/readings?from={}&to={}",
            at(10),
            at(20)
        ))
        .await;
    assert_eq!(status, 200);
    let ts: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ts"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (10..20).map(at).collect();
    assert_eq!(ts, want);
    let paged = all_readings(&s, &sensor, 7).await;
    let ts: Vec<String> = paged
        .iter()
        .map(|r| r["ts"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ts, (0..30).map(at).collect::<Vec<_>>());
    assert_eq!(paged[3]["data"], 1);

    // A new reading is visible at once, before it ships, next to the shipped ones.
    s.readings(json!({"sensor_id": sensor, "data": 1, "ts": at(31)}))
        .await;
    let (_, body) = s
        .get(&format!("/v1/sensors/{sensor}/readings?from={}", at(29)))
        .await;
    assert_eq!(body["items"].as_array().unwrap().len(), 2, "{body}");
    let (_, body) = s
        .get(&format!("/v1/sensors/{sensor}/events?limit=1000"))
        .await;
    assert_eq!(body["items"].as_array().unwrap().len(), 30, "{body}");

    // Webhook attempts ship with the client and sensor they were for.
    r.wait_for(1, 10).await;
    let attempts = format!(
        "SELECT count() FROM {db}.notification_attempts \
         WHERE sensor_id = '{sensor}' AND client_id = '{client}' AND status_code = 200"
    );
    eventually(20, "attempts in ClickHouse", || async {
        (count(&url, &attempts).await? >= 1).then_some(())
    })
    .await;
    // The audit trail ships too, and the store still answers for it.
    let audit = format!(
        "SELECT count() FROM {db}.audit WHERE resource = 'clients/{client}/sensors/{sensor}' \
         AND method = 'PUT'"
    );
    eventually(20, "the link's audit record in ClickHouse", || async {
        (count(&url, &audit).await? == 1).then_some(())
    })
    .await;
    let (_, trail) = s
        .get(&format!(
            "/v1/audit?resource=clients/{client}/sensors/{sensor}"
        ))
        .await;
    assert_eq!(trail["items"].as_array().unwrap().len(), 1, "{trail}");

    // Deleting the sensor deletes its shipped history too (a mutation, applied soon).
    let (status, _) = s.delete(&format!("/v1/sensors/{sensor}")).await;
    assert_eq!(status, 204);
    eventually(20, "history of the deleted sensor gone", || async {
        (count(&url, &in_ch).await? == 0).then_some(())
    })
    .await;
    s.stop().await;
    query(&url, &format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_batch_shipped_twice_reads_once() {
    let Some(url) = shared().await else { return };
    let db = unique("latch_t_");
    let ch = ClickHouse::new(&Target::parse(&url, &db).unwrap());
    ch.ensure_schema().await.unwrap();
    let sensor = SensorId::parse(&unique("d")).unwrap();
    let batch = HistoryBatch {
        readings: (0..5)
            .map(|i| Stored {
                id: 100 + i,
                row: ReadingRecord {
                    sensor_id: sensor,
                    data: i % 2 == 0,
                    ts: t0() + i,
                    received_at: t0() + i,
                    late: false,
                    signals: Default::default(),
                },
            })
            .collect(),
        ..Default::default()
    };
    // latch stopped between ClickHouse's acknowledgement and the spool delete: the next
    // start ships the same rows again.
    ch.insert(&batch).await.unwrap();
    ch.insert(&batch).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = latch::store::sqlite::SqliteStore::open(
        dir.path(),
        latch::store::sqlite::Synchronous::Normal,
    )
    .unwrap();
    let history = History::new(Arc::new(store), Some(ch));
    let page = history
        .readings(
            sensor,
            TimeRange::default(),
            PageRequest {
                limit: 3,
                after: None,
            },
        )
        .await
        .unwrap();
    let ids: Vec<i64> = page.items.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![100, 101, 102]);
    let rest = history
        .readings(
            sensor,
            TimeRange::default(),
            PageRequest {
                limit: 3,
                after: page.next,
            },
        )
        .await
        .unwrap();
    let ids: Vec<i64> = rest.items.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![103, 104]);
    assert_eq!(rest.next, None);
    query(&url, &format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn clickhouse_outage_during_ingest_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut ch) = private(&tmp.path().join("clickhouse")).await else {
        return;
    };
    let url = ch.url();
    let s = TestServer::start_with(|c| {
        c.clickhouse_url = Some(url.clone());
        c.clickhouse_flush = Duration::from_millis(100);
    })
    .await;
    let sensor = unique("o");
    s.sensor(&sensor).await;
    let post = |from: i64, to: i64| {
        let batch: Vec<Value> = (from..to)
            .map(|i| json!({"sensor_id": sensor, "data": i % 2, "ts": at(i)}))
            .collect();
        s.post("/v1/readings", Value::Array(batch))
    };
    // Distinct rows: a shipment cut short by the kill (its readings in, its events not) is
    // shipped again, and ClickHouse holds those readings twice until a merge folds them;
    // reads say DISTINCT, which the page check at the end holds to.
    let in_ch = format!("SELECT uniqExact(id) FROM latch.readings WHERE sensor_id = '{sensor}'");
    for i in 0..5 {
        let (status, body) = post(i * 10, i * 10 + 10).await;
        assert_eq!((status.as_u16(), &body["accepted"]), (202, &json!(10)));
    }
    eventually(20, "the first 50 shipped", || async {
        (count(&url, &in_ch).await? == 50).then_some(())
    })
    .await;

    ch.stop();
    for i in 5..15 {
        let (status, body) = post(i * 10, i * 10 + 10).await;
        assert_eq!(
            (status.as_u16(), &body["accepted"]),
            (202, &json!(10)),
            "ingest goes on while ClickHouse is down"
        );
    }
    // Reads need ClickHouse: they say so rather than answering with part of the history.
    let (status, body) = s.get(&format!("/v1/sensors/{sensor}/readings")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "history_unavailable", "{body}");

    ch.resume().await.unwrap();
    eventually(60, "all 150 in ClickHouse after it is back", || async {
        (count(&url, &in_ch).await? == 150).then_some(())
    })
    .await;
    let all = all_readings(&s, &sensor, 40).await;
    let ts: Vec<String> = all
        .iter()
        .map(|r| r["ts"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ts, (0..150).map(at).collect::<Vec<_>>());
    s.stop().await;
}

#[tokio::test]
async fn latch_killed_with_rows_in_the_spool_ships_them_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut ch) = private(&tmp.path().join("clickhouse")).await else {
        return;
    };
    let url = ch.url();
    let dir = tmp.path().join("latch");
    let db = crate::utils::database_url(&dir).await;
    let env = [
        ("LATCH_CLICKHOUSE_URL", url.clone()),
        ("LATCH_CLICKHOUSE_FLUSH", "100ms".to_string()),
    ];
    let http = reqwest::Client::new();
    let sensor = unique("k");
    ch.stop();
    let p = Process::start_env(&dir, db.clone(), &env);
    p.ready(&http).await;
    let created = http
        .post(format!("{}/v1/sensors", p.base))
        .json(&json!({"id": sensor, "address": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let batch: Vec<Value> = (0..40)
        .map(|i| json!({"sensor_id": sensor, "data": i % 2, "ts": at(i)}))
        .collect();
    let ack: Value = http
        .post(format!("{}/v1/readings", p.base))
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ack["accepted"], 40);
    // The metrics say what is going on (the process has its own metrics).
    let metric = |name: &'static str| {
        let req = http.get(format!("{}/metrics", p.base));
        async move {
            let text = req.send().await.ok()?.text().await.ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        }
    };
    eventually(20, "ClickHouse reported down, spool counted", || async {
        let up = metric("latch_clickhouse_up ").await?;
        let failures = metric("latch_history_ship_failures_total ").await?;
        let depth = metric("latch_history_spool_rows ").await?;
        (up == 0.0 && failures >= 1.0 && depth >= 40.0).then_some(())
    })
    .await;
    p.kill9();

    ch.resume().await.unwrap();
    let p = Process::start_env(&dir, db, &env);
    p.ready(&http).await;
    // Distinct rows: a shipment the kill cut short may land twice (reads say DISTINCT).
    let in_ch = format!("SELECT uniqExact(id) FROM latch.readings WHERE sensor_id = '{sensor}'");
    eventually(
        30,
        "the 40 spooled readings shipped after the restart",
        || async { (count(&url, &in_ch).await? == 40).then_some(()) },
    )
    .await;
    let body: Value = http
        .get(format!(
            "{}/v1/sensors/{sensor}/readings?limit=1000",
            p.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["items"].as_array().unwrap().len(), 40, "{body}");
    let shipped = http
        .get(format!("{}/metrics", p.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        shipped
            .lines()
            .any(|l| l.starts_with("latch_history_shipped_rows_total ")),
        "{shipped}"
    );
    p.kill9();
}

#[tokio::test]
async fn ten_years_of_backfilled_readings_ship() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = private(&tmp.path().join("clickhouse")).await else {
        return;
    };
    let url = ch.url();
    let s = TestServer::start_with(|c| {
        c.clickhouse_url = Some(url.clone());
        c.clickhouse_flush = Duration::from_millis(100);
    })
    .await;
    let sensor = unique("y");
    s.sensor(&sensor).await;
    // One reading every month for ten years, sent in one request: one shipment whose rows
    // fall into 120 monthly partitions (ClickHouse takes at most 100 per insert).
    let start = time::parse("2016-01-15T12:00:00Z").unwrap();
    let month = 30 * 24 * 3600 * 1000_i64 + 10 * 3600 * 1000;
    let ts: Vec<String> = (0..122).map(|i| time::format(start + i * month)).collect();
    let batch: Vec<Value> = ts
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"sensor_id": sensor, "data": i % 2, "ts": t}))
        .collect();
    s.readings(Value::Array(batch)).await;
    let in_ch = format!("SELECT count() FROM latch.readings WHERE sensor_id = '{sensor}'");
    eventually(30, "ten years of readings in ClickHouse", || async {
        (count(&url, &in_ch).await? == 122).then_some(())
    })
    .await;
    let months = format!(
        "SELECT uniqExact(toYYYYMM(toDateTime(intDiv(ts, 1000)))) FROM latch.readings \
         WHERE sensor_id = '{sensor}'"
    );
    assert!(count(&url, &months).await.unwrap() > 100);
    eventually(30, "the spool emptied", || async {
        let (_, m) = s.get("/metrics").await;
        let m = m.as_str().unwrap_or("").to_string();
        m.lines()
            .any(|l| l == "latch_history_spool_rows 0")
            .then_some(())
    })
    .await;
    let read: Vec<String> = all_readings(&s, &sensor, 1000)
        .await
        .iter()
        .map(|r| r["ts"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(read, ts);
    s.stop().await;
}

/// Retention with ClickHouse: a round drops the monthly partitions wholly past
/// retention (18.16 has no TTL) and keeps the others; the oldest reading follows.
#[tokio::test]
async fn retention_drops_clickhouse_months_past_it() {
    use latch::history::retention::{Settings, round};
    let Some(url) = shared().await else { return };
    let db = unique("latch_t_");
    let ch = ClickHouse::new(&Target::parse(&url, &db).unwrap());
    ch.ensure_schema().await.unwrap();
    let sensor = SensorId::parse(&unique("r")).unwrap();
    let old = time::parse("2024-01-15T12:00:00Z").unwrap();
    let reading = |id, ts| Stored {
        id,
        row: ReadingRecord {
            sensor_id: sensor,
            data: true,
            ts,
            received_at: ts,
            late: false,
            signals: Default::default(),
        },
    };
    let attempt = |id, at| latch::store::AttemptRecord {
        id,
        client_id: "c".into(),
        sensor_id: sensor.to_string(),
        kind: "sensor.state_changed".into(),
        attempt: latch::domain::Attempt {
            notification_id: format!("n{id}"),
            at,
            status_code: Some(200),
            error: None,
            duration_ms: 3,
        },
    };
    ch.insert(&HistoryBatch {
        readings: vec![reading(1, old), reading(2, t0())],
        attempts: vec![attempt(1, old), attempt(2, t0())],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(ch.oldest_reading().await.unwrap(), Some(old));

    let dir = tempfile::tempdir().unwrap();
    let store = latch::store::sqlite::SqliteStore::open(
        dir.path(),
        latch::store::sqlite::Synchronous::Normal,
    )
    .unwrap();
    let day = Duration::from_secs(86_400);
    let settings = Settings {
        readings: Some(90 * day),
        notifications: Some(30 * day),
    };
    let now = t0() + 10 * 86_400_000;
    let pruned = round(&store, Some(&ch), settings, now).await;
    assert_eq!(
        pruned.partitions, 2,
        "January 2024 of readings and of attempts"
    );
    let left = |table: &str| format!("SELECT count() FROM {db}.{table}");
    assert_eq!(count(&url, &left("readings")).await, Some(1));
    assert_eq!(count(&url, &left("notification_attempts")).await, Some(1));
    assert_eq!(ch.oldest_reading().await.unwrap(), Some(t0()));
    // Zero keeps forever; a month not wholly past retention stays.
    let pruned = round(
        &store,
        Some(&ch),
        Settings::default(),
        now + 400 * 86_400_000,
    )
    .await;
    assert_eq!(pruned.partitions, 0);
    assert_eq!(count(&url, &left("readings")).await, Some(1));
    query(&url, &format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
}
