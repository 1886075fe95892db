//! A batched client (issue #36): its notifications arrive several to a signed request, in
//! order per sensor, and a batch that failed comes again as itself.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::choices::signature;
use crate::utils::{Answer, Received, Receiver, TestServer, eventually, unique};

/// A client of `r` batching up to `max_events`, waiting `max_wait_ms`; returns its id and
/// secret.
async fn batched(
    s: &TestServer,
    r: &Receiver,
    max_events: u32,
    max_wait_ms: u32,
) -> (String, String) {
    let batch = json!({"max_events": max_events, "max_wait_ms": max_wait_ms});
    let (code, body) = s
        .post(
            "/v1/clients",
            json!({"name": "batched", "url": r.url, "batch": batch}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["batch"], batch);
    let id = body["id"].as_str().unwrap().to_string();
    (id, body["secret"].as_str().unwrap().to_string())
}

/// `n` sensors linked to `client`.
async fn sensors(s: &TestServer, client: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = unique("bat");
        s.sensor(&id).await;
        s.link(client, &id).await;
        ids.push(id);
    }
    ids
}

fn events(r: &Received) -> Vec<Value> {
    assert_eq!(r.body["type"], "batch", "{}", r.body);
    r.body["events"].as_array().unwrap().clone()
}

/// Waits until the batches `r` answered 2xx hold `n` events.
async fn wait_events(r: &Receiver, n: u64) {
    eventually(20, &format!("{n} batched events"), || async {
        (r.events_ok() >= n).then_some(())
    })
    .await
}

#[tokio::test]
async fn a_batched_client_gets_signed_batches_in_order_per_sensor() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let (client, secret) = batched(&s, &r, 5, 200).await;
    let ids = sensors(&s, &client, 12).await;
    // Every sensor changes three times: 1, 0, 1.
    for data in [1, 0, 1] {
        let readings: Vec<Value> = ids
            .iter()
            .map(|id| json!({"sensor_id": id, "data": data}))
            .collect();
        s.readings(json!(readings)).await;
    }
    // Superseded states never go out, so each sensor's last state is what must arrive.
    eventually(20, "every sensor's last state", || async {
        let got = r.received();
        let last: usize = ids
            .iter()
            .filter(|id| {
                got.iter().flat_map(events).any(|e| {
                    e["sensor"]["id"] == id.as_str() && e["data"] == 1 && e["previous"] == 0
                })
            })
            .count();
        (last == ids.len()).then_some(())
    })
    .await;
    s.dispatcher_round().await;
    let got = r.received();
    let mut per_sensor: HashMap<String, Vec<i64>> = HashMap::new();
    for req in &got {
        // One signed request per batch: its id is the webhook-id, the signature covers
        // the whole body.
        let id = req.body["id"].as_str().unwrap();
        assert_eq!(req.headers["webhook-id"], id);
        let ts = req.headers["webhook-timestamp"].to_str().unwrap();
        assert_eq!(
            req.headers["webhook-signature"].to_str().unwrap(),
            signature(&secret, id, ts, &req.raw)
        );
        let evs = events(req);
        assert!((1..=5).contains(&evs.len()), "{} events", evs.len());
        let mut lanes: Vec<&str> = evs
            .iter()
            .map(|e| e["sensor"]["id"].as_str().unwrap())
            .collect();
        lanes.sort();
        lanes.dedup();
        assert_eq!(lanes.len(), evs.len(), "one notification a sensor a batch");
        for e in evs {
            assert_eq!(e["type"], "sensor.state_changed");
            assert_ne!(e["id"], req.body["id"], "each event keeps its own id");
            let at = latch::domain::time::parse(e["occurred_at"].as_str().unwrap()).unwrap();
            per_sensor
                .entry(e["sensor"]["id"].as_str().unwrap().to_string())
                .or_default()
                .push(at);
        }
    }
    for (sensor, times) in per_sensor {
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "{sensor}: an older state after a newer one: {times:?}"
        );
    }
    assert_eq!(r.max_inflight(), 1, "one batch in flight");
    // The history names the batch that carried each notification.
    let delivered = s
        .notifications(&format!("client_id={client}&status=delivered"))
        .await;
    let batch_ids: Vec<&str> = got.iter().map(|g| g.body["id"].as_str().unwrap()).collect();
    assert!(!delivered.is_empty());
    for n in &delivered {
        assert!(batch_ids.contains(&n["batch_id"].as_str().unwrap()), "{n}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_failed_batch_comes_again_as_the_same_batch() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    r.script([Answer::status(503)]);
    // A wait long enough that the four events are one batch though the engine's shards
    // commit them apart.
    let (client, _) = batched(&s, &r, 10, 2_000).await;
    let ids = sensors(&s, &client, 4).await;
    let readings: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    s.readings(json!(readings)).await;
    wait_events(&r, 4).await;
    let got = r.received();
    assert_eq!(got.len(), 2, "the failed batch, then its retry");
    let event_ids = |req: &Received| {
        let mut v: Vec<String> = events(req)
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(got[0].body["id"], got[1].body["id"], "the same batch id");
    assert_eq!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    assert_eq!(event_ids(&got[0]), event_ids(&got[1]), "the same events");
    assert_eq!(event_ids(&got[0]).len(), 4);
    let rows = eventually(10, "the retry recorded", || async {
        let rows = s.notifications(&format!("client_id={client}")).await;
        rows.iter()
            .all(|n| n["status"] == "delivered")
            .then_some(rows)
    })
    .await;
    for n in rows {
        assert_eq!(n["attempt_count"], 2);
        assert_eq!(n["batch_id"], got[0].body["id"]);
    }
    s.stop().await;
}

#[tokio::test]
async fn batch_settings_are_checked_and_can_be_lifted() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    for bad in [
        json!({"max_events": 0, "max_wait_ms": 0}),
        json!({"max_events": 1001, "max_wait_ms": 0}),
        json!({"max_events": 10, "max_wait_ms": 10001}),
    ] {
        let (code, body) = s
            .post(
                "/v1/clients",
                json!({"name": "b", "url": r.url, "batch": bad}),
            )
            .await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("batch.")
        );
    }
    let (client, _) = batched(&s, &r, 10, 10_000).await;
    let ids = sensors(&s, &client, 2).await;
    // Lifted while the batch waits out its 10 s: what gathered goes one by one at once.
    let readings: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    s.readings(json!(readings)).await;
    s.dispatcher_round().await;
    assert_eq!(r.count(), 0, "still gathering");
    let (code, body) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "batched", "url": r.url}),
        )
        .await;
    assert_eq!((code, body["batch"].clone()), (StatusCode::OK, Value::Null));
    let got = r.wait_for(2, 5).await;
    for g in got {
        assert_eq!(g.body["type"], "sensor.state_changed", "{}", g.body);
    }
    s.stop().await;
}
