//! Cluster ingest through RabbitMQ's consistent-hash exchange (issue #37), with three real
//! `latch serve` processes and the real broker: every node consumes its partitions'
//! queues, a killed node's queues are consumed again once its partitions move, and what
//! the cluster makes of the readings is what one node makes of them. Each test has its
//! own exchange, queues and schema.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use serde_json::json;

use latch::domain::partition::Partitioning;
use latch::ingest::amqp::exchange::queue_name;

use crate::amqp::{broker, url};
use crate::utils::cluster::{Cluster, LEASE, PARTITIONS, Sent, check_consistent, reading, value};
use crate::utils::{Receiver, eventually, unique};

/// The settings of a cluster consuming exchange `exchange` (the plain queue beside it).
fn env(exchange: &str) -> [(&'static str, String); 3] {
    [
        ("LATCH_AMQP_URL", url()),
        ("LATCH_AMQP_QUEUE", format!("{exchange}-plain")),
        ("LATCH_AMQP_EXCHANGE", exchange.to_string()),
    ]
}

/// Publishes one reading to the exchange with the sensor id as routing key, as a producer
/// does, waiting for the broker's confirm.
async fn publish(ch: &Channel, exchange: &str, sensor: &str, body: &[u8]) {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            sensor.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!confirm.is_nack(), "the broker took the reading");
}

/// The queue of partition `p` of a test cluster on a new database (the exchange's
/// partitioning, as `GET /v1/cluster` says).
fn queue(exchange: &str, p: u32) -> String {
    queue_name(exchange, Partitioning::exchange(PARTITIONS), p)
}

/// Consumers on each partition queue, as RabbitMQ counts them (a passive declare).
async fn consumers(ch: &Channel, exchange: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let q = ch
            .queue_declare(
                queue(exchange, p).as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        out.push(q.consumer_count());
    }
    out
}

/// Deletes what the nodes declared for `exchange` (the broker is shared by every test).
pub(crate) async fn clean_up(ch: &Channel, exchange: &str) {
    for p in 0..PARTITIONS {
        let name = queue(exchange, p);
        let _ = ch
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for q in [format!("{exchange}-plain"), format!("{exchange}-plain.dlq")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
}

/// Rounds of readings (one per sensor, `ts` a second after the round before) published
/// to the exchange until stopped; what the broker confirmed.
struct Producer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Sent, usize)>,
}

impl Producer {
    fn start(ch: Channel, exchange: String, sensors: Vec<String>, rounds: Option<usize>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let base = latch::domain::time::now_ms() - 3_600_000;
            let mut sent = Sent::new();
            let mut r = 0;
            while !s.load(Ordering::SeqCst) && rounds.is_none_or(|n| r < n) {
                let ts = base + r as i64 * 1000;
                for (i, id) in sensors.iter().enumerate() {
                    let body = reading(id, value(i, r), ts).to_string();
                    publish(&ch, &exchange, id, body.as_bytes()).await;
                    sent.entry(id.clone()).or_default().push((ts, value(i, r)));
                }
                r += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (sent, r)
        });
        Self { stop, task }
    }

    async fn stop(self) -> (Sent, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the producer did not fail")
    }
}

/// Waits until every sent reading is in the history of its sensor.
async fn all_applied(c: &Cluster, via: &str, sent: &Sent, secs: u64) {
    eventually(secs, "every published reading applied", || async {
        for (id, readings) in sent {
            let h = c
                .get(via, &format!("/v1/sensors/{id}/readings?limit=1000"))
                .await;
            let stored: std::collections::HashSet<String> = h["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["ts"].as_str().unwrap().to_string())
                .collect();
            if stored.len() < readings.len() {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// The readings each node took off the broker and had accepted.
async fn consumed(c: &Cluster) -> Vec<f64> {
    let mut out = Vec::new();
    for base in c.live() {
        out.push(
            c.node_metric(&base, "latch_readings_accepted_total{source=\"amqp\"}")
                .await,
        );
    }
    out
}

#[tokio::test]
async fn every_node_consumes_its_partitions_queues_of_the_exchange() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let exchange = unique("lx");
    let Some(c) = Cluster::start_env(3, &env(&exchange)).await else {
        return;
    };
    assert_eq!(
        c.partitioning().await,
        Partitioning::exchange(PARTITIONS),
        "a new database partitions as the exchange does"
    );
    eventually(
        10,
        "each partition's queue has one consumer: its owner",
        || async {
            consumers(&ch, &exchange)
                .await
                .iter()
                .all(|&n| n == 1)
                .then_some(())
        },
    )
    .await;
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("ax", 45, &r.url, json!({})).await;
    let (sent, rounds) = Producer::start(ch.clone(), exchange.clone(), sensors, Some(6))
        .stop_after_all()
        .await;
    let live = c.live();
    all_applied(&c, &live[0], &sent, 60).await;

    // The counter follows the commit's reply, so the last batch may count a moment later.
    let per_node = eventually(10, "every reading counted", || async {
        let per_node = consumed(&c).await;
        (per_node.iter().sum::<f64>() as usize >= sent.len() * rounds).then_some(per_node)
    })
    .await;
    assert!(
        per_node.iter().all(|&n| n > 0.0),
        "every node consumed its share: {per_node:?}"
    );
    let total: f64 = per_node.iter().sum();
    assert_eq!(
        total as usize,
        sent.len() * rounds,
        "each reading taken once"
    );
    for (id, readings) in &sent {
        let h = c
            .get(&live[1], &format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        assert_eq!(
            h["items"].as_array().unwrap().len(),
            readings.len(),
            "{id}: each reading applied once"
        );
    }
    check_consistent(&c, &live[2], &client, &sent, &r).await;
    // Each queue holds exactly its partition's sensors, and its consumer owns them.
    let forwarded = c
        .metric("latch_cluster_forwarded_readings_total{source=\"amqp\"}")
        .await;
    eprintln!(
        "exchange ingest over 3 nodes: {total} readings, {forwarded} forwarded to their owner"
    );
    assert_eq!(
        forwarded, 0.0,
        "no reading published to the exchange takes a hop"
    );
    drop(c);
    clean_up(&ch, &exchange).await;
}

impl Producer {
    /// Waits for a producer given a number of rounds to send them all.
    async fn stop_after_all(self) -> (Sent, usize) {
        self.task.await.expect("the producer did not fail")
    }
}

#[tokio::test]
async fn a_killed_nodes_queues_move_and_nothing_acknowledged_is_lost() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let exchange = unique("lk");
    let Some(mut c) = Cluster::start_env(3, &env(&exchange)).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("ak", 30, &r.url, json!({})).await;
    let producer = Producer::start(ch.clone(), exchange.clone(), sensors, None);
    // A few rounds in, so the node dies with readings in flight.
    tokio::time::sleep(Duration::from_millis(800)).await;

    c.kill9(2);
    let killed = Instant::now();
    // RabbitMQ sees the connection drop at once: the dead node's queues have no consumer
    // until their partitions move.
    let orphaned = eventually(
        10,
        "the killed node's queues without a consumer",
        || async {
            let n = consumers(&ch, &exchange).await;
            n.contains(&0).then_some(n)
        },
    )
    .await;
    let orphans: Vec<usize> = (0..orphaned.len()).filter(|&p| orphaned[p] == 0).collect();
    eventually(
        LEASE.as_secs() + 5,
        "every queue consumed again within the lease and 5 s",
        || async {
            consumers(&ch, &exchange)
                .await
                .iter()
                .all(|&n| n == 1)
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "queues {orphans:?} consumed again {:?} after the kill",
        killed.elapsed()
    );
    c.balanced(2, 20).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (sent, rounds) = producer.stop().await;
    assert!(
        rounds >= 4,
        "readings flowed before and after the kill: {rounds} rounds"
    );

    let live = c.live();
    all_applied(&c, &live[0], &sent, 60).await;
    let per_node = consumed(&c).await;
    assert!(
        per_node.iter().all(|&n| n > 0.0),
        "both survivors consumed: {per_node:?}"
    );
    // Every reading the broker confirmed is applied, each sensor's events are one node's,
    // its notifications arrive in order (a committed reading redelivered after the crash
    // is older than the sensor's last one: kept in history, never a change).
    check_consistent(&c, &live[1], &client, &sent, &r).await;
    drop(c);
    clean_up(&ch, &exchange).await;
}

/// A node joining under load takes its share of the queues from the others while readings
/// flow: each queue's consumer is handed over with its partition, every reading applied
/// exactly once, in order.
#[tokio::test]
async fn a_joining_node_takes_its_queues_over_and_each_reading_applies_once() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let exchange = unique("lj");
    let Some(mut c) = Cluster::start_env(2, &env(&exchange)).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("aj", 30, &r.url, json!({})).await;
    let producer = Producer::start(ch.clone(), exchange.clone(), sensors, None);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let joined = c.add().await;
    c.balanced(3, 20).await;
    eventually(10, "each queue consumed by one node", || async {
        consumers(&ch, &exchange)
            .await
            .iter()
            .all(|&n| n == 1)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (sent, rounds) = producer.stop().await;
    assert!(
        rounds >= 4,
        "readings flowed across the join: {rounds} rounds"
    );

    let live = c.live();
    all_applied(&c, &live[0], &sent, 60).await;
    let joiner = c
        .node_metric(
            c.base(joined),
            "latch_readings_accepted_total{source=\"amqp\"}",
        )
        .await;
    assert!(joiner > 0.0, "the new node consumes its queues");
    for (id, readings) in &sent {
        let h = c
            .get(&live[1], &format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        assert_eq!(
            h["items"].as_array().unwrap().len(),
            readings.len(),
            "{id}: each reading applied once across the handover"
        );
    }
    check_consistent(&c, &live[2], &client, &sent, &r).await;
    drop(c);
    clean_up(&ch, &exchange).await;
}
