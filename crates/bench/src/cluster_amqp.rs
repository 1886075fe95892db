//! `latch bench cluster --via amqp`: readings published to the consistent-hash exchange
//! (routing key = sensor id), consumed by one node and then by N nodes on another schema,
//! in the same run; and the share of them each node handed to another node because the
//! sensor's partition is not its own (none, on a new database partitioned as the exchange
//! routes; two in three through the plain queue of three nodes).
//!
//! The readings are published first, while the nodes are balanced and consuming, as fast
//! as the broker confirms them; the figure is readings accepted per second from the first
//! publish until every one is accepted (the nodes' `latch_readings_accepted_total
//! {source="amqp"}`, scraped every 250 ms).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::json;

use super::cluster::{Args, Group, sum_metric};
use super::{Keep, Receiver, Report};
use latch::domain::SensorId;
use latch::domain::partition::Partitioning;
use latch::ingest::amqp::exchange::queue_name;

/// Publishes not yet confirmed, per publisher, before it waits for the broker.
const IN_FLIGHT: usize = 1000;

/// One group's figures.
struct Run {
    accepted: f64,
    per_s: f64,
    forwarded: f64,
    /// Readings each node took off the broker.
    per_node: Vec<f64>,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ids = super::sensor_ids(args.sensors);
    let mut r = Report::new("cluster-amqp");
    r.add("nodes", args.nodes as f64, "nodes");
    r.add("partitions", f64::from(args.partitions), "partitions");
    r.add("readings", args.readings as f64, "readings");
    let mut runs = Vec::new();
    for n in [1, args.nodes] {
        let exchange = format!("latch-bench-{}", ulid::Ulid::new());
        let env = [
            ("LATCH_AMQP_URL", args.amqp_url.clone()),
            ("LATCH_AMQP_QUEUE", format!("{exchange}-plain")),
            ("LATCH_AMQP_EXCHANGE", exchange.clone()),
        ];
        let receiver = Receiver::start_keeping(Keep::Counts).await?;
        let group = Group::start_env(n, &args, &ids, &[], &receiver, &http, &env).await?;
        eprintln!("cluster --via amqp: {n} node(s) ready");
        let run = ingest(&args, &group.bases(), &ids, &exchange, "", &http).await;
        // Beside it, the same readings through the plain queue, which the node holding
        // partition 0 consumes alone (the way a cluster took AMQP before the exchange).
        let plain = match (&run, n > 1) {
            (Ok(_), true) => {
                let queue = format!("{exchange}-plain");
                Some(ingest(&args, &group.bases(), &ids, "", &queue, &http).await)
            }
            _ => None,
        };
        group.stop().await?;
        clean_up(&args, &exchange).await;
        runs.push(run?);
        if let Some(plain) = plain {
            runs.push(plain?);
        }
    }
    let (one, many, plain) = (&runs[0], &runs[1], &runs[2]);
    for (label, f) in [
        ("single", one),
        ("cluster", many),
        ("cluster_plain_queue", plain),
    ] {
        r.add(format!("{label}_readings_accepted"), f.accepted, "readings");
        r.add(
            format!("{label}_ingest_per_s"),
            f.per_s.round(),
            "readings/s",
        );
        r.add(
            format!("{label}_forwarded_readings"),
            f.forwarded,
            "readings",
        );
        r.add(
            format!("{label}_forwarded_share"),
            f.forwarded / f.accepted.max(1.0),
            "x",
        );
    }
    for (i, c) in many.per_node.iter().enumerate() {
        r.add(format!("cluster_node{}_consumed", i + 1), *c, "readings");
    }
    r.add("ingest_ratio", many.per_s / one.per_s, "x");
    r.add(
        "exchange_to_plain_queue_ratio",
        many.per_s / plain.per_s,
        "x",
    );
    r.notes.push(format!(
        "PostgreSQL, {} latch serve processes on one schema against 1 on another, same run: \
         {} readings of {} sensors (10 % changes) published to a consistent-hash exchange \
         with the sensor id as routing key ({} publishers, confirms awaited {IN_FLIGHT} at a \
         time), one single-active-consumer queue per partition, each consumed by the \
         partition's owner. cluster_plain_queue: the same count of readings then published \
         to the plain queue (LATCH_AMQP_QUEUE) of the same cluster, consumed by the node \
         holding partition 0 alone. forwarded = readings a node took off the broker and \
         handed to the owner of their partition (latch_cluster_forwarded_readings_total\
         {{source=amqp}}, counted per phase).",
        args.nodes, args.readings, args.sensors, args.workers
    ));
    Ok(r)
}

/// Publishes `args.readings` readings of `ids` to `exchange` (routing key: the sensor id)
/// or, with `exchange` empty, to `queue`, and waits until the nodes accepted them.
async fn ingest(
    args: &Args,
    bases: &[String],
    ids: &[SensorId],
    exchange: &str,
    queue: &str,
    http: &reqwest::Client,
) -> anyhow::Result<Run> {
    let name = "latch_readings_accepted_total{source=\"amqp\"}";
    let forwarded_name = "latch_cluster_forwarded_readings_total{source=\"amqp\"}";
    let accepted_before = sum_metric(http, bases, name).await;
    let forwarded_before = sum_metric(http, bases, forwarded_name).await;
    let mut per_node_before = Vec::new();
    for b in bases {
        per_node_before.push(sum_metric(http, std::slice::from_ref(b), name).await);
    }
    let conn = Connection::connect(&args.amqp_url, ConnectionProperties::default()).await?;
    let next = Arc::new(AtomicU64::new(0));
    let total = args.readings as u64;
    let started = Instant::now();
    let workers = args.workers.max(1);
    let conn = Arc::new(conn);
    let published = super::workers(workers, |w| {
        // Each publisher its own sensors, so none reorders another's readings.
        let mine: Vec<String> = ids
            .iter()
            .skip(w)
            .step_by(workers)
            .map(ToString::to_string)
            .collect();
        let (conn, next) = (conn.clone(), next.clone());
        let (exchange, queue) = (exchange.to_string(), queue.to_string());
        async move {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            let mut pending = Vec::with_capacity(IN_FLIGHT);
            let mut k = 0usize;
            loop {
                if next.fetch_add(1, Ordering::Relaxed) >= total || mine.is_empty() {
                    break;
                }
                let id = &mine[k % mine.len()];
                let round = k / mine.len();
                // One reading in ten changes its sensor's state.
                let data = u8::from(round % 20 >= 10);
                let body = json!({"sensor_id": id, "data": data}).to_string();
                pending.push(
                    ch.basic_publish(
                        exchange.as_str().into(),
                        if exchange.is_empty() {
                            queue.as_str()
                        } else {
                            id.as_str()
                        }
                        .into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?,
                );
                k += 1;
                if pending.len() >= IN_FLIGHT {
                    for c in pending.drain(..) {
                        anyhow::ensure!(!c.await?.is_nack(), "the broker refused a reading");
                    }
                }
            }
            for c in pending {
                anyhow::ensure!(!c.await?.is_nack(), "the broker refused a reading");
            }
            Ok::<_, anyhow::Error>(k as u64)
        }
    })
    .await;
    let mut sent = 0;
    for p in published {
        sent += p?;
    }
    let deadline = Instant::now() + args.drain;
    let mut accepted;
    loop {
        accepted = sum_metric(http, bases, name).await - accepted_before;
        if accepted >= sent as f64 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{accepted} of {sent} readings accepted within {:?}",
            args.drain
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let forwarded = sum_metric(http, bases, forwarded_name).await - forwarded_before;
    let mut per_node = Vec::new();
    for (b, before) in bases.iter().zip(per_node_before) {
        per_node.push(sum_metric(http, std::slice::from_ref(b), name).await - before);
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(Run {
        accepted,
        per_s: accepted / secs,
        forwarded,
        per_node,
    })
}

/// Deletes the exchange and the queues the nodes declared (best effort).
async fn clean_up(args: &Args, exchange: &str) {
    let Ok(conn) = Connection::connect(&args.amqp_url, ConnectionProperties::default()).await
    else {
        return;
    };
    let Ok(ch) = conn.create_channel().await.context("channel") else {
        return;
    };
    // The bench's schemas are new: the exchange's partitioning names the queues.
    let partitioning = Partitioning::exchange(args.partitions);
    let mut queues: Vec<String> = (0..args.partitions)
        .map(|p| queue_name(exchange, partitioning, p))
        .collect();
    queues.push(format!("{exchange}-plain"));
    queues.push(format!("{exchange}-plain.dlq"));
    for q in queues {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
}
