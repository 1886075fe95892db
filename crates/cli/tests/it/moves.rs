//! Partition moves seen by a client, through real `latch serve` processes on one
//! PostgreSQL: a receiver slow to answer while a node joins or stops. The lane promise
//! holds across the move (never two requests of one sensor at once, never an older state
//! after a newer one), an attempt's answer is recorded as it happened, the lane goes on as
//! soon as that answer is in, the node that gave a partition up makes no attempt for it
//! after, and a handover from a live node keeps the sensors' deadlines.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use latch::domain::partition::Partitioning;
use latch::domain::{SensorId, time};
use serde_json::{Value, json};

use crate::utils::cluster::{Cluster, PARTITIONS, post_until_accepted};
use crate::utils::{Answer, Receiver, eventually, unique};

/// How long an attempt may take: the receiver holds each sensor's first change until the
/// move is done and the new states are posted, which must come well within it.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Sensors, each with one held request in flight when the partitions move.
const SENSORS: usize = 40;

/// Nodes whose attempts outlast the held answers (a 60 s timeout, so a lease of 185 s),
/// that send every sensor's request at once, and that let attempts in flight finish when
/// stopped.
fn patient() -> Vec<(&'static str, String)> {
    vec![
        ("LATCH_DELIVERY_TIMEOUT", format!("{}s", TIMEOUT.as_secs())),
        ("LATCH_DELIVERY_CLIENT_CONCURRENCY", "64".into()),
        ("LATCH_SHUTDOWN_GRACE", format!("{}s", TIMEOUT.as_secs())),
    ]
}

fn readings(sensors: &[String], data: u8) -> Vec<Value> {
    sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": data}))
        .collect()
}

/// A receiver that holds the first `n` requests until released, then answers them 204;
/// the rest at once.
async fn held_receiver(n: usize) -> Receiver {
    let r = Receiver::start().await;
    r.script(std::iter::repeat_n(Answer::status(204), n));
    r.hold(n);
    r
}

/// Releases the held answers once the move is done, and checks that it came while they
/// were still in flight: an attempt that timed out meanwhile would prove nothing.
fn release(r: &Receiver, in_flight: Instant) {
    let held = in_flight.elapsed();
    assert!(
        held < TIMEOUT / 2,
        "the move took {held:?}, too near the attempts' timeout: the test proves nothing"
    );
    r.release();
}

/// Every notification of `client`, once all of them are delivered.
async fn all_delivered(c: &Cluster, via: &str, client: &str, n: usize) -> Vec<Value> {
    eventually(30, "every notification delivered", || async {
        let page = c
            .get(
                via,
                &format!("/v1/notifications?client_id={client}&limit=1000"),
            )
            .await;
        let items = page["items"].as_array()?.clone();
        (items.len() == n && items.iter().all(|i| i["status"] == "delivered")).then_some(items)
    })
    .await
}

/// Checks the receiver's side of the move: per sensor the first state, then the second,
/// never two requests of one sensor at once.
fn check_received(r: &Receiver) {
    assert_eq!(
        r.max_inflight_per_sensor(),
        1,
        "two requests of one sensor were in flight at once"
    );
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for g in r.received() {
        let sensor = g.body["sensor"]["id"].as_str().unwrap().to_string();
        seen.entry(sensor)
            .or_default()
            .push(g.body["data"].as_u64().unwrap());
    }
    for (sensor, data) in seen {
        assert_eq!(data, [1, 0], "sensor {sensor}: what it was sent, in order");
    }
}

#[tokio::test]
async fn a_join_waits_for_the_old_owners_attempts_and_goes_on_when_they_end() {
    let Some(mut c) = Cluster::start_env(1, &patient()).await else {
        return;
    };
    let r = held_receiver(SENSORS).await;
    let (client, sensors) = c.fleet("mj", SENSORS, &r.url, json!({})).await;
    let first = vec![c.base(0).to_string()];
    post_until_accepted(&c.http, &first, readings(&sensors, 1), 20).await;
    r.wait_for(SENSORS, 20).await;
    let in_flight = Instant::now();

    // A second node joins and takes half the partitions while every request is out.
    c.add().await;
    c.balanced(2, 20).await;
    let second = vec![c.base(1).to_string()];
    post_until_accepted(&c.http, &second, readings(&sensors, 0), 20).await;
    // A new state sent while its sensor's first is held fails `check_received`.
    release(&r, in_flight);
    let answered = Instant::now();

    // The new states follow the held answers at once: not at the next full sweep (a
    // minute on) nor when the old owner's leases (185 s) run out.
    r.wait_for(2 * SENSORS, 10).await;
    eprintln!(
        "every new state received {:?} after the held answers",
        answered.elapsed()
    );
    check_received(&r);
    // Answered 204, so delivered: whichever node owns the partition now.
    all_delivered(&c, c.base(1), &client, 2 * SENSORS).await;
}

#[tokio::test]
async fn a_stopped_nodes_attempts_finish_and_the_lane_goes_on_when_they_end() {
    let Some(mut c) = Cluster::start_env(2, &patient()).await else {
        return;
    };
    let r = held_receiver(SENSORS).await;
    let (client, sensors) = c.fleet("ms", SENSORS, &r.url, json!({})).await;
    post_until_accepted(&c.http, &c.live(), readings(&sensors, 1), 20).await;
    r.wait_for(SENSORS, 20).await;
    let in_flight = Instant::now();

    // Node 0 is stopped: it hands its partitions over at once and waits for its attempts.
    let stopping = c.nodes[0].process.take().expect("node 0 runs");
    let stopped = tokio::spawn(stopping.terminate());
    c.balanced(1, 20).await;
    let rest = vec![c.base(1).to_string()];
    post_until_accepted(&c.http, &rest, readings(&sensors, 0), 20).await;
    release(&r, in_flight);
    let answered = Instant::now();

    r.wait_for(2 * SENSORS, 10).await;
    eprintln!(
        "every new state received {:?} after the held answers",
        answered.elapsed()
    );
    assert!(stopped.await.unwrap(), "the stopped node exits cleanly");
    check_received(&r);
    all_delivered(&c, c.base(1), &client, 2 * SENSORS).await;
}

#[tokio::test]
async fn a_stop_whose_grace_runs_out_gives_back_what_it_cut_and_the_lanes_go_on() {
    // A rolling restart whose grace (1 s) is shorter than the receiver's answers (held
    // until the test releases them), with attempts allowed 60 s each (so a lease of
    // 185 s): the stopping node cuts its attempts off when the grace runs out and records
    // them as failed attempts, and the node serving their lanes now goes on at once,
    // without waiting for those leases.
    let env = vec![
        ("LATCH_DELIVERY_TIMEOUT", format!("{}s", TIMEOUT.as_secs())),
        ("LATCH_DELIVERY_CLIENT_CONCURRENCY", "64".to_string()),
        ("LATCH_SHUTDOWN_GRACE", "1s".to_string()),
        // The cut attempts' retries wait for the new states, which supersede them: a retry
        // due before those are posted would send a 1 again, as documented.
        ("LATCH_RETRY_BASE", "10s".to_string()),
        ("LATCH_RETRY_MAX_DELAY", "30s".to_string()),
    ];
    let Some(mut c) = Cluster::start_env(2, &env).await else {
        return;
    };
    let r = held_receiver(SENSORS).await;
    let (client, sensors) = c.fleet("mg", SENSORS, &r.url, json!({})).await;
    post_until_accepted(&c.http, &c.live(), readings(&sensors, 1), 20).await;
    r.wait_for(SENSORS, 20).await;
    let in_flight = Instant::now();

    let stopping = c.nodes[0].process.take().expect("node 0 runs");
    let stopped = tokio::spawn(stopping.terminate());
    c.balanced(1, 20).await;
    let rest = vec![c.base(1).to_string()];
    post_until_accepted(&c.http, &rest, readings(&sensors, 0), 20).await;
    // Node 0's grace runs out while its answers are held: it cuts them off and exits.
    assert!(stopped.await.unwrap(), "the stopped node exits cleanly");
    release(&r, in_flight);
    // Every sensor's new state arrives well before the cut attempts' leases (185 s) would
    // have run out: the stopped node's lanes as soon as their leases were given back, the
    // other node's once its held answers came.
    r.wait_for(2 * SENSORS, 25).await;
    eprintln!(
        "every new state received {:?} after the stop",
        in_flight.elapsed()
    );
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for g in r.received() {
        let sensor = g.body["sensor"]["id"].as_str().unwrap().to_string();
        seen.entry(sensor)
            .or_default()
            .push(g.body["data"].as_u64().unwrap());
    }
    for (sensor, data) in &seen {
        assert_eq!(data, &[1, 0], "sensor {sensor}: what it was sent, in order");
    }
    // The cut attempts are in the history as attempts without an answer; their
    // notifications were superseded by the newer state, which was delivered.
    let page = c
        .get(
            c.base(1),
            &format!("/v1/notifications?client_id={client}&limit=1000"),
        )
        .await;
    let items = page["items"].as_array().unwrap();
    let cut = items
        .iter()
        .filter(|n| n["status"] == "superseded" && n["attempt_count"] == 1)
        .count();
    assert!(cut > 0, "no attempt was cut off: the test proves nothing");
    eventually(20, "every new state delivered", || async {
        let page = c
            .get(
                c.base(1),
                &format!("/v1/notifications?client_id={client}&status=delivered&limit=1000"),
            )
            .await;
        let zeros = page["items"]
            .as_array()?
            .iter()
            .filter(|n| n["data"] == 0)
            .count();
        (zeros == SENSORS).then_some(())
    })
    .await;
}

/// `n` fresh sensor ids in the partitions a second node takes from the first (the upper
/// half: the first hands its highest partitions over).
fn ids_that_move(partitioning: Partitioning, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < n {
        let id = unique(prefix);
        if partitioning.of(SensorId::parse(&id).unwrap()) >= PARTITIONS / 2 {
            ids.push(id);
        }
    }
    ids
}

/// Registers `ids` with `body` and links them to a new client for `url` through `via`.
async fn register(c: &Cluster, via: &str, ids: &[String], url: &str, body: Value) -> String {
    let client = c
        .post(via, "/v1/clients", json!({"name": "c", "url": url}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    for id in ids {
        let mut sensor = body.clone();
        sensor["id"] = json!(id);
        sensor["address"] = json!("a");
        c.post(via, "/v1/sensors", sensor).await;
        c.put(via, &format!("/v1/clients/{client}/sensors/{id}"))
            .await;
    }
    client
}

#[tokio::test]
async fn a_node_that_hands_a_partition_over_makes_no_attempt_for_it_after() {
    let env = [("LATCH_RETRY_MAX_ATTEMPTS", "1000".to_string())];
    let Some(mut c) = Cluster::start_env(1, &env).await else {
        return;
    };
    // A receiver that always fails: every lane retries about once a second.
    let r = Receiver::start().await;
    r.always(Answer::status(500));
    let ids = ids_that_move(c.partitioning().await, "mh", 6);
    let via = c.base(0).to_string();
    register(&c, &via, &ids, &r.url, json!({})).await;
    post_until_accepted(&c.http, std::slice::from_ref(&via), readings(&ids, 1), 20).await;
    r.wait_for(2 * ids.len(), 20).await;

    c.add().await;
    c.balanced(2, 20).await;
    let attempts = "latch_delivery_attempts_total";
    let (first, second) = (c.base(0).to_string(), c.base(1).to_string());
    let before = c.node_metric(&first, attempts).await;
    // The new owner retries each lane a few times…
    let lanes = ids.len() as f64;
    eventually(30, "the new owner's retries", || async {
        (c.node_metric(&second, attempts).await >= 3.0 * lanes).then_some(())
    })
    .await;
    // …and the old one made none: at most the one attempt per lane in flight at the move.
    let after = c.node_metric(&first, attempts).await;
    assert!(
        after - before <= lanes,
        "the old owner went on attempting: {} attempts for {lanes} lanes after the move",
        after - before
    );
}

#[tokio::test]
async fn a_handover_keeps_the_sensors_deadlines() {
    let Some(mut c) = Cluster::start(1).await else {
        return;
    };
    let r = Receiver::start().await;
    let timeout_s: i64 = 12;
    let ids = ids_that_move(c.partitioning().await, "md", 3);
    let via = c.base(0).to_string();
    register(
        &c,
        &via,
        &ids,
        &r.url,
        json!({"heartbeat_timeout_s": timeout_s}),
    )
    .await;
    post_until_accepted(&c.http, std::slice::from_ref(&via), readings(&ids, 1), 20).await;
    // When latch heard them, by its own clock (the deadline counts from it).
    let sensor = c.get(&via, &format!("/v1/sensors/{}", ids[0])).await;
    let heard = time::parse(sensor["status"]["last_seen_at"].as_str().unwrap()).unwrap();
    // Some of the timeout passes; then a node joins and takes the sensors' partitions.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let joined = time::now_ms();
    c.add().await;
    c.balanced(2, 20).await;

    for id in &ids {
        let lost = eventually(40, "the silent sensor lost", || async {
            let ev = c.get(c.base(1), &format!("/v1/sensors/{id}/events")).await;
            ev["items"]
                .as_array()?
                .iter()
                .find(|e| e["type"] == "sensor.connection_lost")
                .cloned()
        })
        .await;
        let at = time::parse(lost["at"].as_str().unwrap()).unwrap();
        assert!(
            at >= heard + timeout_s * 1000,
            "{id}: lost at {at}, before its deadline"
        );
        // A takeover's grace would have made it `joined + timeout` at the earliest.
        assert!(
            at < joined + timeout_s * 1000,
            "{id}: lost at {}, {} ms after its deadline: the move postponed it",
            time::format(at),
            at - heard - timeout_s * 1000
        );
    }
}
