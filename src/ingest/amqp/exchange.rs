//! Cluster ingest through RabbitMQ's consistent-hash exchange: every node consumes its
//! own share.
//!
//! Producers publish to one exchange (`amqp_exchange`, type `x-consistent-hash`, plugin
//! `rabbitmq_consistent_hash_exchange`) with the sensor id as routing key. latch declares
//! it with one durable queue per partition ([`queue_name`]), each bound with weight 1, so
//! RabbitMQ sends every reading of a sensor to the same queue, always. Queue `p` is
//! consumed by the node that serves partition `p` and moves with it; the queues are
//! single-active-consumer, so even while a partition moves (the new owner subscribes
//! before the old one has let go) one node at a time takes a queue's messages, in order.
//!
//! What a queue holds is the exchange's choice: its bucket for the routing key, bucket `i`
//! being the `i`-th queue bound. A cluster on a new database partitions by that very
//! function ([`crate::domain::partition::exchange`]) and latch binds the queues in
//! partition order, so queue `p` holds exactly partition `p`'s sensors and the node
//! consuming it applies every reading it takes: no hop. On a database partitioned by MD5
//! (older than that choice) a queue carries sensors of every partition, and the consuming
//! node forwards those of other partitions to their owners ([`crate::cluster::forward`]),
//! about (N−1)/N of them; the same path catches any reading the ring sends elsewhere
//! (bindings changed by hand), so the mapping is a matter of speed, never of correctness.
//! Either way each node takes 1/N of the messages off the broker, parses, dedups and
//! dead-letters them, and a node's death stops only its share until its partitions (and
//! queues) move.
//!
//! A partition handed over stops its queue's consumer the way latch stops: no new
//! deliveries, the batches in the engine committed and acknowledged, then the channel
//! closed; RabbitMQ requeues the rest in order and activates the new owner's waiting
//! consumer.
//!
//! The ids of the messages a queue's consumer applied ([`Dedup`]) outlive its channel and
//! the connection: a connection lost after a commit and before RabbitMQ took its
//! acknowledgement has the broker redeliver those messages to the next consumer of that
//! queue on this node, which must recognise them, as the plain queue's consumer does. After a `kill -9` RabbitMQ requeues the dead node's unacknowledged messages
//! at once, and the node that takes the partition over consumes them.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{consume, durable};
use crate::domain::partition::{Partitioning, Scheme};
use crate::ingest::{Dedup, Ingest, Sources, next_backoff, paused};

/// The name [`Sources`] (`/readyz`, `latch_source_up`) knows the exchange's connection by.
pub const SOURCE: &str = "amqp_exchange";
/// The exchange type the plugin adds.
pub const KIND: &str = "x-consistent-hash";
/// Unacknowledged deliveries per partition queue. A node may consume every queue (alone
/// in its cluster): 128 partitions make 64 Ki messages in flight at most.
pub const QUEUE_PREFETCH: u16 = 512;
/// Message ids remembered per queue: a committed message whose acknowledgement was lost
/// comes back after fewer than twice the prefetch other messages of its queue committed.
pub const QUEUE_DEDUP_WINDOW: usize = 4 * QUEUE_PREFETCH as usize;

/// The exchange and what it feeds.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    pub exchange: String,
    /// Where rejected messages go: the plain queue's `{queue}.dlq`, one place for all.
    pub dlq: String,
    /// The cluster's partitions: one queue each.
    pub partitions: Partitioning,
}

impl Settings {
    /// The queue of partition `p` ([`queue_name`]).
    pub fn queue(&self, p: u32) -> String {
        queue_name(&self.exchange, self.partitions, p)
    }
}

/// The queue of partition `p` of `exchange`. Exchange partitioning: `{exchange}.p007`,
/// zero-padded so that name order is partition order, the order RabbitMQ rebuilds the ring
/// in after a restart. MD5 clusters keep the names they were made with, `{exchange}.7`
/// (their queues hold every partition's sensors anyway).
pub fn queue_name(exchange: &str, partitions: Partitioning, p: u32) -> String {
    match partitions.scheme {
        Scheme::Md5 => format!("{exchange}.{p}"),
        Scheme::Exchange => {
            let width = partitions.count.saturating_sub(1).to_string().len().max(3);
            format!("{exchange}.p{p:0width$}")
        }
    }
}

/// The partitions this node serves, as the cluster layer publishes them.
pub type Served = watch::Receiver<Arc<BTreeSet<u32>>>;

/// Consumes the queues of the partitions `served` names until `stop`; reconnects with
/// backoff when the connection fails. Down (for `/readyz` and the broker link) until the
/// first connection has declared everything.
pub async fn run(
    ingest: Ingest,
    settings: Settings,
    served: Served,
    sources: Sources,
    stop: CancellationToken,
) {
    let settings = Arc::new(settings);
    let memory = Memory::default();
    let mut backoff = Duration::ZERO;
    loop {
        let result = session(
            &ingest,
            &settings,
            served.clone(),
            &sources,
            &stop,
            &memory,
            &mut backoff,
        )
        .await;
        sources.set(SOURCE, false);
        let Err(e) = result else { break };
        let what = format!("exchange {}", settings.exchange);
        if !paused(SOURCE, &what, &format!("{e:#}"), &mut backoff, &stop).await {
            break;
        }
    }
    tracing::info!("RabbitMQ exchange ingest stopped.");
}

/// The applied message ids of each partition queue, kept across connections.
#[derive(Clone, Default)]
struct Memory(Arc<std::sync::Mutex<HashMap<u32, Arc<tokio::sync::Mutex<Dedup>>>>>);

impl Memory {
    /// Partition `p`'s ids. A Tokio mutex, held by the queue's consumer for its whole
    /// life: a consumer started while the last one of the queue still drains (the
    /// partition came back at once) takes over the ids only once that one is done.
    fn of(&self, p: u32) -> Arc<tokio::sync::Mutex<Dedup>> {
        self.0
            .lock()
            .expect("exchange memory lock")
            .entry(p)
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Dedup::new(QUEUE_DEDUP_WINDOW))))
            .clone()
    }
}

/// One connection: declare, then one consumer per served partition, following `served`.
async fn session(
    ingest: &Ingest,
    settings: &Arc<Settings>,
    served: Served,
    sources: &Sources,
    stop: &CancellationToken,
    memory: &Memory,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
    // Named after the exchange, so an operator (or a test) can find this connection.
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(format!("latch {}", settings.exchange)));
    let conn = Arc::new(Connection::connect(&settings.url, props).await?);
    let result = serve(
        &conn, ingest, settings, served, sources, stop, memory, backoff,
    )
    .await;
    let reason = if result.is_ok() {
        "latch stopping"
    } else {
        "latch reconnects"
    };
    let _ = conn.close(200, reason.into()).await;
    result
}

/// Declares the topology (idempotent: every node does it at every connection): the
/// dead-letter queue, the partition queues, the exchange, and the bindings last, so the
/// exchange routes nowhere but to latch's queues.
pub async fn declare(conn: &Connection, s: &Settings) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    ch.queue_declare(s.dlq.as_str().into(), durable(), FieldTable::default())
        .await?;
    let mut single = FieldTable::default();
    single.insert(
        ShortString::from("x-single-active-consumer"),
        AMQPValue::Boolean(true),
    );
    for p in 0..s.partitions.count {
        ch.queue_declare(s.queue(p).as_str().into(), durable(), single.clone())
            .await
            .with_context(|| {
                format!(
                    "declaring queue {} (single-active-consumer, durable)",
                    s.queue(p)
                )
            })?;
    }
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        s.exchange.as_str().into(),
        ExchangeKind::Custom(KIND.into()),
        options,
        FieldTable::default(),
    )
    .await
    .with_context(|| {
        format!(
            "declaring exchange {} of type {KIND}: enable the plugin \
             (rabbitmq-plugins enable rabbitmq_consistent_hash_exchange), or set \
             LATCH_AMQP_EXCHANGE= (empty) to consume the plain queue only",
            s.exchange
        )
    })?;
    // Weight 1 each, in partition order: the exchange's bucket `p` is then queue `p`, the
    // bucket latch's exchange partitioning computes for the sensors of partition `p`. Binding
    // again what is bound changes nothing, so nodes declaring at once, each in this order,
    // leave the order as one node would; and RabbitMQ, rebuilding the ring at a restart
    // from the bindings sorted by weight and queue name, rebuilds this one (the names sort
    // as the partitions do). Should the ring differ anyway (bindings made by hand), every
    // reading still reaches its owner: the consuming node forwards what is not its own.
    for p in 0..s.partitions.count {
        ch.queue_bind(
            s.queue(p).as_str().into(),
            s.exchange.as_str().into(),
            "1".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    let _ = ch.close(200, "declared".into()).await;
    Ok(())
}

/// Runs a consumer for each served partition's queue, starting and stopping them as
/// `served` changes. `Err` when the connection failed.
#[allow(clippy::too_many_arguments)]
async fn serve(
    conn: &Arc<Connection>,
    ingest: &Ingest,
    settings: &Arc<Settings>,
    mut served: Served,
    sources: &Sources,
    stop: &CancellationToken,
    memory: &Memory,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
    declare(conn, settings).await?;
    *backoff = Duration::ZERO;
    sources.set(SOURCE, true);
    tracing::info!(exchange = %settings.exchange, queues = settings.partitions.count,
        partitioning = settings.partitions.scheme.as_str(),
        "RabbitMQ exchange ingest declared; consuming the queues of this node's partitions.");
    let tasks = TaskTracker::new();
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<anyhow::Result<()>>();
    let mut running: HashMap<u32, CancellationToken> = HashMap::new();
    let result = loop {
        let wanted = served.borrow_and_update().clone();
        running.retain(|p, token| {
            let keep = wanted.contains(p);
            if !keep {
                // It finishes what it holds, acknowledges, and lets go of the queue.
                token.cancel();
            }
            keep
        });
        for &p in wanted.iter() {
            if running.contains_key(&p) {
                continue;
            }
            let token = stop.child_token();
            running.insert(p, token.clone());
            let (conn, settings, ingest, ended) = (
                conn.clone(),
                settings.clone(),
                ingest.clone(),
                ended_tx.clone(),
            );
            let dedup = memory.of(p);
            tasks.spawn(async move {
                let mut dedup = dedup.lock().await;
                let served = serve_queue(conn, settings, p, ingest, &mut dedup, token).await;
                let _ = ended.send(served);
            });
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => break Ok(()),
            changed = served.changed() => {
                // The cluster layer is gone: the node is stopping.
                if changed.is_err() { break Ok(()); }
            }
            Some(Err(e)) = ended.recv() => break Err(e),
        }
    };
    for token in running.values() {
        token.cancel();
    }
    tasks.close();
    tasks.wait().await;
    result
}

/// One partition queue on a channel of its own (acknowledgements are per channel), until
/// `stop`. A failed commit or a channel error ends the channel, and the queue is consumed
/// again after a growing delay; `Err` only when the connection itself is gone. `dedup` is
/// the queue's own (a queue's messages come back only to a consumer of that queue), and
/// outlives the connection.
async fn serve_queue(
    conn: Arc<Connection>,
    settings: Arc<Settings>,
    p: u32,
    ingest: Ingest,
    dedup: &mut Dedup,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let name = settings.queue(p);
    let mut backoff = Duration::ZERO;
    loop {
        let ch = conn.create_channel().await?;
        let queue = consume::Queue {
            name: &name,
            dlq: &settings.dlq,
            prefetch: QUEUE_PREFETCH,
        };
        let result = consume::consume(&ch, queue, &ingest, &stop, dedup, &mut backoff, || {
            tracing::debug!(queue = %name, "Consuming a partition queue (RabbitMQ makes this consumer active once no other node holds it).");
        })
        .await;
        let _ = ch.close(200, "latch lets the queue go".into()).await;
        let Err(e) = result else {
            return Ok(());
        };
        if !conn.status().connected() {
            return Err(e);
        }
        backoff = next_backoff(backoff);
        tracing::warn!(queue = %name, error = format!("{e:#}"), retry_in = ?backoff,
            "RabbitMQ partition queue paused.");
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(partitions: Partitioning) -> Settings {
        Settings {
            url: String::new(),
            exchange: "latch.by-sensor".into(),
            dlq: "latch.readings.dlq".into(),
            partitions,
        }
    }

    #[test]
    fn md5_clusters_keep_their_queue_names() {
        let s = settings(Partitioning::md5(128));
        assert_eq!(s.queue(0), "latch.by-sensor.0");
        assert_eq!(s.queue(127), "latch.by-sensor.127");
    }

    /// RabbitMQ rebuilds the ring from the bindings sorted by queue name: that order must
    /// be the partitions' order, the order latch binds them in.
    #[test]
    fn exchange_queue_names_sort_as_their_partitions() {
        for count in [1, 8, 128, 1000, 1001, 4096] {
            let s = settings(Partitioning::exchange(count));
            let names: Vec<String> = (0..count).map(|p| s.queue(p)).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "{count} partitions");
        }
        let s = settings(Partitioning::exchange(128));
        assert_eq!(s.queue(7), "latch.by-sensor.p007");
        assert_eq!(s.queue(127), "latch.by-sensor.p127");
    }
}
