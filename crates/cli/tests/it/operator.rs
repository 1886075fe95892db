//! What an operator on shift reads through the API the console draws from: the last hour
//! of rates kept by latch itself (`GET /v1/fleet/rates`), the notifications newest first
//! with filters, and search over sensors and clients.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Answer, Receiver, TestServer, eventually, unique};

fn sum(body: &Value, key: &str) -> u64 {
    body[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {body}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// Rates are there when a page opens: latch counted them itself, before anyone asked.
#[tokio::test]
async fn rates_of_the_last_hour_are_kept_by_latch() {
    let tmp = tempfile::tempdir().unwrap();
    // On a bucket's start, so every count below lands in one bucket.
    let t0 = (now_ms() / 10_000 + 1) * 10_000;
    let clock = Clock::manual(t0);
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let (st, body) = s.get("/v1/fleet/rates").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["bucket_s"], 10);
    assert_eq!(body["nodes"], 1);
    assert_eq!(body["readings"].as_array().unwrap().len(), 360);
    assert_eq!(sum(&body, "readings"), 0);

    let ok = Receiver::start().await;
    let failing = Receiver::start().await;
    failing.always(Answer::status(500));
    let (a, b) = (unique("ra"), unique("rb"));
    s.sensor(&a).await;
    s.sensor(&b).await;
    let good = s.client(&ok.url).await;
    let bad = s.client(&failing.url).await;
    s.link(&good, &a).await;
    s.link(&bad, &b).await;
    // 5 readings, 3 of them changes (first value of a and of b, then 1 → 0 of a).
    s.readings(json!([{"sensor_id": a, "data": 1}, {"sensor_id": b, "data": 1}]))
        .await;
    ok.wait_for(1, 10).await;
    failing.wait_for(1, 10).await;
    s.readings(json!([
        {"sensor_id": a, "data": 1}, {"sensor_id": a, "data": 0}, {"sensor_id": b, "data": 1}
    ]))
    .await;
    ok.wait_for(2, 10).await;
    // Let the attempts' outcomes be counted, then close the bucket.
    eventually(10, "both attempts recorded", || async {
        let d = s
            .notifications(&format!("client_id={good}&status=delivered"))
            .await;
        let f = s.notifications(&format!("client_id={bad}")).await;
        (d.len() == 2 && f.first().is_some_and(|n| n["attempt_count"] == 1)).then_some(())
    })
    .await;
    let (_, open) = s.get("/v1/fleet/rates").await;
    assert_eq!(
        sum(&open, "readings"),
        0,
        "the bucket in progress is left out"
    );
    clock.advance(Duration::from_secs(10));
    let (_, body) = s.get("/v1/fleet/rates").await;
    let last = |key: &str| body[key].as_array().unwrap()[359].as_u64().unwrap();
    assert_eq!(last("readings"), 5, "{body}");
    assert_eq!(last("changes"), 3, "{body}");
    assert_eq!(last("delivered"), 2, "{body}");
    assert_eq!(last("failed"), 1, "{body}");
    assert_eq!(sum(&body, "readings"), 5);
    assert_eq!(
        latch::domain::time::parse(body["to"].as_str().unwrap()),
        Some(t0 + 10_000)
    );

    // Lost and restored too (heartbeat of 1 s for this sensor).
    let c = unique("rc");
    let (st, _) = s
        .post(
            "/v1/sensors",
            json!({"id": c, "address": "x", "heartbeat_timeout_s": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    s.readings(json!({"sensor_id": c, "data": 1})).await;
    clock.advance(Duration::from_secs(2));
    s.engine_round().await;
    s.readings(json!({"sensor_id": c, "data": 1})).await;
    clock.advance(Duration::from_secs(10));
    let (_, body) = s.get("/v1/fleet/rates").await;
    assert_eq!(sum(&body, "lost"), 1, "{body}");
    assert_eq!(sum(&body, "restored"), 1, "{body}");
    // An hour on, it has all rolled out of the window.
    clock.advance(Duration::from_secs(3600));
    let (_, body) = s.get("/v1/fleet/rates").await;
    assert_eq!(sum(&body, "readings"), 0);
    s.stop().await;
}

/// What just failed comes first, filtered by type, status and time; the old order and
/// its cursors are unchanged.
#[tokio::test]
async fn notifications_newest_first_with_filters() {
    let s = TestServer::start().await;
    let ok = Receiver::start().await;
    let failing = Receiver::start().await;
    failing.always(Answer::status(410));
    let (a, b) = (unique("na"), unique("nb"));
    s.sensor(&a).await;
    s.sensor(&b).await;
    let good = s.client(&ok.url).await;
    let bad = s.client(&failing.url).await;
    s.link(&good, &a).await;
    s.link(&bad, &b).await;
    let started = latch::domain::time::format(now_ms() - 1);
    for (i, data) in [1, 0, 1].into_iter().enumerate() {
        s.readings(json!({"sensor_id": a, "data": data})).await;
        ok.wait_for(i + 1, 10).await;
    }
    s.readings(json!({"sensor_id": b, "data": 1})).await;
    let failed = eventually(10, "the 410 dead-lettered", || async {
        let f = s
            .notifications(&format!("client_id={bad}&status=failed"))
            .await;
        f.first().cloned()
    })
    .await;

    let newest = s.notifications(&format!("order=desc&from={started}")).await;
    assert!(newest.len() >= 4, "{newest:?}");
    assert_eq!(newest[0]["id"], failed["id"], "the newest first");
    let seqs = |v: &[Value]| {
        v.iter()
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let mut oldest = s.notifications(&format!("from={started}")).await;
    oldest.reverse();
    assert_eq!(
        seqs(&newest),
        seqs(&oldest),
        "one order is the other reversed"
    );

    // Paging newest first with the cursor.
    let (_, page1) = s
        .get(&format!(
            "/v1/notifications?order=desc&limit=2&client_id={good}"
        ))
        .await;
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, page2) = s
        .get(&format!(
            "/v1/notifications?order=desc&limit=2&client_id={good}&cursor={cursor}"
        ))
        .await;
    let all = s
        .notifications(&format!("order=desc&client_id={good}"))
        .await;
    let paged: Vec<Value> = page1["items"]
        .as_array()
        .unwrap()
        .iter()
        .chain(page2["items"].as_array().unwrap())
        .cloned()
        .collect();
    assert_eq!(seqs(&paged), seqs(&all[..3]));

    // "Failed in the last hour".
    let hour_ago = latch::domain::time::format(now_ms() - 3_600_000);
    let f = s
        .notifications(&format!("order=desc&status=failed&from={hour_ago}"))
        .await;
    assert_eq!(
        f.iter().filter(|n| n["client_id"] == bad.as_str()).count(),
        1
    );
    assert!(f.iter().all(|n| n["status"] == "failed"));
    let later = latch::domain::time::format(now_ms() + 60_000);
    assert!(s.notifications(&format!("from={later}")).await.is_empty());
    let changes = s
        .notifications(&format!("type=sensor.state_changed&sensor_id={a}"))
        .await;
    assert_eq!(changes.len(), 3);
    assert!(
        s.notifications(&format!("type=sensor.connection_lost&sensor_id={a}"))
            .await
            .is_empty()
    );

    for bad_query in ["order=sideways", "type=sensor.exploded", "from=yesterday"] {
        let (st, body) = s.get(&format!("/v1/notifications?{bad_query}")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad_query}: {body}");
    }
    s.stop().await;
}

/// Sensors by id prefix or address words, clients by name.
#[tokio::test]
async fn sensors_and_clients_are_found() {
    let s = TestServer::start().await;
    let tag = unique("q");
    let door = format!("{tag}D");
    let gate = format!("{tag}G");
    for (id, address) in [
        (&door, format!("Svobody st. 23 {tag}")),
        (&gate, format!("Baumana 5 {tag}")),
    ] {
        let (st, body) = s
            .post("/v1/sensors", json!({"id": id, "address": address}))
            .await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let ids = |b: &Value| {
        b["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (_, body) = s.get(&format!("/v1/sensors?q={tag}")).await;
    assert_eq!(ids(&body), [door.clone(), gate.clone()], "by id prefix");
    let (_, body) = s
        .get(&format!("/v1/sensors?q=svobody%20{}", tag.to_lowercase()))
        .await;
    assert_eq!(ids(&body), [door.as_str()], "by address words");
    let (_, body) = s
        .get(&format!("/v1/sensors?q=baum%20{tag}&connection=unknown"))
        .await;
    assert_eq!(ids(&body), [gate.as_str()]);
    let (st, _) = s.get(&format!("/v1/sensors?q={}", "x".repeat(201))).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    let name = format!("Night shift {tag}");
    let (_, c) = s
        .post(
            "/v1/clients",
            json!({"name": name, "url": "https://example.com/h"}),
        )
        .await;
    let (_, body) = s
        .get(&format!("/v1/clients?q=SHIFT%20{}", tag.to_lowercase()))
        .await;
    assert_eq!(ids(&body), [c["id"].as_str().unwrap().to_string()]);
    s.stop().await;
}
