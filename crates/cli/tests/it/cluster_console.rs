//! The console's view of a cluster, whichever node serves it: the live stream carries the
//! events of sensors other nodes own, and the rates are the sum over the live nodes. Two
//! real `latch serve` processes on one PostgreSQL schema.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::utils::cluster::Cluster;
use crate::utils::{eventually, unique};

/// Reads `GET /v1/stream` of `base` for `secs`, returning the sensor ids of its events.
async fn events_for(
    response: &mut reqwest::Response,
    buffer: &mut String,
    secs: u64,
) -> Vec<String> {
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(secs);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, response.chunk()).await {
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data:")) {
                let v: Value = serde_json::from_str(data.trim()).unwrap();
                if let Some(id) = v["sensor_id"].as_str() {
                    seen.push(id.to_string());
                }
            }
        }
    }
    seen
}

async fn sensors(c: &Cluster, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|_| unique("cc")).collect();
    for id in &ids {
        c.post(c.base(0), "/v1/sensors", json!({"id": id, "address": "a"}))
            .await;
    }
    ids
}

#[tokio::test]
async fn a_nodes_stream_shows_the_events_of_sensors_other_nodes_own() {
    let Some(c) = Cluster::start(2).await else {
        return;
    };
    let ids = sensors(&c, 16).await;
    // No timeout: the stream stays open for as long as the test reads it.
    let mut stream = reqwest::Client::new()
        .get(format!("{}/v1/stream", c.base(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut buffer = String::new();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Changes, again and again, until every sensor's showed up (the relay connects to
    // the other node a moment after the stream opens).
    for round in 0u8.. {
        let readings: Vec<Value> = ids
            .iter()
            .map(|id| json!({"sensor_id": id, "data": round % 2}))
            .collect();
        c.post(c.base(0), "/v1/readings", Value::Array(readings))
            .await;
        seen.extend(events_for(&mut stream, &mut buffer, 2).await);
        if ids.iter().all(|id| seen.contains(id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 0's stream never showed {:?}",
            ids.iter()
                .filter(|id| !seen.contains(*id))
                .collect::<Vec<_>>()
        );
    }
    // Some of them were the other node's: node 0 forwarded their readings to it.
    let forwarded = c
        .node_metric(c.base(0), "latch_cluster_forwarded_readings_total")
        .await;
    assert!(forwarded > 0.0, "every sensor landed on node 0");
}

#[tokio::test]
async fn rates_are_summed_over_the_live_nodes() {
    let Some(c) = Cluster::start(2).await else {
        return;
    };
    let ids = sensors(&c, 16).await;
    let readings: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    c.post(c.base(0), "/v1/readings", Value::Array(readings))
        .await;
    let total = |v: &Value, key: &str| -> u64 {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    // Each reading is counted once, by the node that owns its sensor, in a bucket that
    // is shown once complete (10 s).
    for i in 0..2 {
        let body = eventually(30, "the readings' bucket complete", || async {
            let body = c.get(c.base(i), "/v1/fleet/rates").await;
            (total(&body, "readings") >= 16).then_some(body)
        })
        .await;
        assert_eq!(body["nodes"], 2, "{body}");
        assert_eq!(body["missing"], json!([]));
        assert_eq!(total(&body, "readings"), 16, "node {i}: {body}");
        assert_eq!(total(&body, "changes"), 16, "node {i}");
    }
}

/// A token deleted through one node ends the streams it holds open on another, once that
/// node reloads the token table (every second): a stream is a request that lasts.
#[tokio::test]
async fn a_token_deleted_through_one_node_ends_its_stream_on_another() {
    let bootstrap = unique("boot");
    let Some(c) = Cluster::start_env(2, &[("LATCH_API_TOKEN", bootstrap)]).await else {
        return;
    };
    let made = c
        .post(
            c.base(0),
            "/v1/tokens",
            json!({"name": "wall screen", "scopes": ["read"]}),
        )
        .await;
    let (id, token) = (
        made["id"].as_str().unwrap(),
        made["token"].as_str().unwrap(),
    );
    let plain = reqwest::Client::new();
    eventually(10, "node 1 knows the token", || async {
        let r = plain
            .get(format!("{}/v1/sensors", c.base(1)))
            .bearer_auth(token)
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let mut stream = plain
        .get(format!("{}/v1/stream", c.base(1)))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let gone = c
        .http
        .delete(format!("{}/v1/tokens/{id}", c.base(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 204);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "node 1 still streams to a deleted token");
}
