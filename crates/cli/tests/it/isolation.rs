//! Clients are isolated: nothing one client's endpoint does delays another client's claims
//! or requests. A client whose endpoint accepts connections and never answers (batched, or
//! holding every request slot it may) shares sensors with a client that answers at once;
//! the healthy one receives every change of every sensor, none superseded while it waited.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::utils::{Receiver, TestServer, eventually, unique};

/// Rounds of changes, and how long the healthy client has for each round's deliveries
/// before the next round: well below the hanging endpoint's timeout (5 s), so a lane
/// held behind one of its requests fails the wait.
const ROUNDS: usize = 8;
const ROUND_S: u64 = 2;
const SENSORS: usize = 20;

/// An endpoint whose host accepts TCP connections and never answers a request; the
/// connections stay open until the test ends.
async fn hanging_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}/hook")
}

async fn client(s: &TestServer, name: &str, url: &str, extra: Value) -> String {
    let mut body = json!({"name": name, "url": url});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (code, body) = s.post("/v1/clients", body).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

/// `SENSORS` sensors linked to both clients.
async fn shared_sensors(s: &TestServer, clients: [&str; 2]) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..SENSORS {
        let id = unique("iso");
        s.sensor(&id).await;
        for c in clients {
            s.link(c, &id).await;
        }
        ids.push(id);
    }
    ids
}

/// Flips every sensor `ROUNDS` times (1, 0, 1, …), each round once the healthy client's
/// receiver has had the one before, within `ROUND_S`.
async fn flip(s: &TestServer, sensors: &[String], healthy: &Receiver) {
    let base = healthy.count();
    for round in 0..ROUNDS {
        let readings: Vec<Value> = sensors
            .iter()
            .map(|id| json!({"sensor_id": id, "data": (round + 1) % 2}))
            .collect();
        s.readings(json!(readings)).await;
        let want = base + sensors.len() * (round + 1);
        let what = format!("round {round} at the healthy client");
        eventually(ROUND_S, &what, || async {
            (healthy.count() >= want).then_some(())
        })
        .await;
    }
}

/// The healthy client got every change, delivered, and none was superseded while waiting.
async fn every_change_delivered(s: &TestServer, fast: &str, r: &Receiver, want: usize) {
    let all = eventually(30, "the healthy client's notifications settled", || async {
        let all = s.notifications(&format!("client_id={fast}")).await;
        (all.len() == want && all.iter().all(|n| n["status"] != "pending")).then_some(all)
    })
    .await;
    let superseded = all.iter().filter(|n| n["status"] == "superseded").count();
    let delivered = all.iter().filter(|n| n["status"] == "delivered").count();
    assert_eq!(
        (delivered, superseded),
        (want, 0),
        "the healthy client's changes waited behind the other client's endpoint"
    );
    assert!(
        r.count() >= want,
        "the receiver saw {} of {want}",
        r.count()
    );
}

#[tokio::test]
async fn a_batched_client_whose_endpoint_hangs_delays_no_other_client() {
    let s = TestServer::start_with(|c| c.delivery_timeout = Duration::from_secs(5)).await;
    let r = Receiver::start().await;
    let hang = hanging_endpoint().await;
    let slow = client(
        &s,
        "slow",
        &hang,
        json!({"batch": {"max_events": 100, "max_wait_ms": 0}}),
    )
    .await;
    let fast = client(&s, "fast", &r.url, json!({})).await;
    let sensors = shared_sensors(&s, [&slow, &fast]).await;
    flip(&s, &sensors, &r).await;
    every_change_delivered(&s, &fast, &r, SENSORS * ROUNDS).await;
}

#[tokio::test]
async fn an_endpoint_that_stops_answering_holds_one_request_slot_not_all() {
    // Four request slots in all, and four a client may take: the hanging client's first
    // attempts take every one of them until they time out. After that it gets one at a
    // time, and the others are the healthy client's.
    let s = TestServer::start_with(|c| {
        c.delivery_timeout = Duration::from_secs(5);
        c.delivery_concurrency = 4;
        c.delivery_client_concurrency = 4;
    })
    .await;
    let r = Receiver::start().await;
    let hang = hanging_endpoint().await;
    let slow = client(&s, "slow", &hang, json!({})).await;
    let fast = client(&s, "fast", &r.url, json!({})).await;
    let sensors = shared_sensors(&s, [&slow, &fast]).await;
    // The first attempts to the hanging endpoint time out.
    let first: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 0}))
        .collect();
    s.readings(json!(first)).await;
    eventually(
        20,
        "the hanging endpoint's first attempts timed out",
        || async {
            let failed = s
                .notifications(&format!("client_id={slow}"))
                .await
                .iter()
                .filter(|n| n["attempt_count"].as_u64() > Some(0))
                .count();
            (failed >= 4).then_some(())
        },
    )
    .await;
    // Everything so far delivered to the healthy client, so the rounds count from here.
    eventually(20, "the first state delivered", || async {
        (r.count() >= SENSORS).then_some(())
    })
    .await;
    let base = s.notifications(&format!("client_id={fast}")).await.len();
    assert_eq!(base, SENSORS);
    flip(&s, &sensors, &r).await;
    every_change_delivered(&s, &fast, &r, SENSORS * (ROUNDS + 1)).await;
}
