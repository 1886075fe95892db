//! RabbitMQ ingest: consumes `amqp_queue`, acknowledges only after the readings' effects are
//! durable, and moves messages that can never apply to `{queue}.dlq` with the reason in a
//! header.
//!
//! Deliveries are taken in batches of what has arrived (up to [`BATCH_MAX`]) and handed to
//! the engine in arrival order; up to [`PIPELINE`] batches wait for their group commit at
//! once, and each is acknowledged with one `basic.ack multiple` in order. A failed commit
//! or a lost connection ends the session without acknowledging: RabbitMQ redelivers, and a
//! redelivered reading repeats a known value, so it changes nothing.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{FutureExt, StreamExt, stream::FuturesOrdered};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use super::{Dedup, Ingest, Report, Sources, next_backoff};
use crate::domain::{RejectCode, Rejection, reading, time::now_ms};

/// Unacknowledged deliveries RabbitMQ may push ahead of our commits.
pub const PREFETCH: u16 = 8192;
/// Most deliveries handed to the engine as one batch.
pub const BATCH_MAX: usize = 2000;
/// Batches waiting for their commit at once.
pub const PIPELINE: usize = 4;
/// Message ids remembered for dedup.
pub const DEDUP_WINDOW: usize = 100_000;

const SOURCE: &str = "amqp";

/// Header naming why a message was dead-lettered (the rejection code).
pub const REASON_HEADER: &str = "x-latch-reason";
/// Header with the human-readable rejection message.
pub const ERROR_HEADER: &str = "x-latch-error";

/// Where to consume from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    pub queue: String,
}

impl Settings {
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.queue)
    }
}

/// Consumes until `stop`; reconnects with backoff whenever the session ends on an error.
pub async fn run(ingest: Ingest, settings: Settings, sources: Sources, stop: CancellationToken) {
    sources.set(SOURCE, false);
    let mut dedup = Dedup::new(DEDUP_WINDOW);
    let mut backoff = Duration::ZERO;
    loop {
        let result = session(
            &ingest,
            &settings,
            &sources,
            &stop,
            &mut dedup,
            &mut backoff,
        )
        .await;
        sources.set(SOURCE, false);
        match result {
            Ok(()) => break,
            Err(e) => {
                backoff = next_backoff(backoff);
                tracing::warn!(error = %e, retry_in = ?backoff, queue = %settings.queue,
                    "RabbitMQ ingest paused.");
                metrics::counter!("latch_source_reconnects_total", "source" => SOURCE).increment(1);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
    }
    tracing::info!("RabbitMQ ingest stopped.");
}

/// A batch handed to the engine, waiting for its commit.
struct Batch {
    last_tag: u64,
    /// Bodies and properties, kept to dead-letter the rejected ones.
    messages: Vec<(Vec<u8>, BasicProperties)>,
    /// Dedup ids of the messages, applied once the batch is durable.
    ids: Vec<String>,
    /// Input positions that were duplicates (acked, not applied).
    dup_count: usize,
}

/// One connection's life: declare, consume, apply, acknowledge.
async fn session(
    ingest: &Ingest,
    settings: &Settings,
    sources: &Sources,
    stop: &CancellationToken,
    dedup: &mut Dedup,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
    // Named after the queue, so an operator (or a test) can find this connection.
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(format!("latch {}", settings.queue)));
    let conn = Connection::connect(&settings.url, props).await?;
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(settings.dlq().into(), durable, FieldTable::default())
        .await?;
    ch.queue_declare(
        settings.queue.clone().into(),
        durable,
        FieldTable::default(),
    )
    .await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let tag = format!("latch-{}", ulid::Ulid::new());
    let mut consumer = ch
        .basic_consume(
            settings.queue.clone().into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    sources.set(SOURCE, true);
    *backoff = Duration::ZERO;
    tracing::info!(queue = %settings.queue, "RabbitMQ ingest consuming.");

    let mut waiting = FuturesOrdered::new();
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled(), if !stopping => {
                stopping = true;
                if waiting.is_empty() { break; }
            }
            done = waiting.next(), if !waiting.is_empty() => {
                let (batch, result): (Batch, Result<Report, super::Error>) =
                    done.expect("non-empty");
                finish(&ch, settings, dedup, batch, result?).await?;
                if stopping && waiting.is_empty() { break; }
            }
            first = consumer.next(), if !stopping && waiting.len() < PIPELINE => {
                let Some(first) = first else {
                    anyhow::bail!("the broker cancelled the consumer");
                };
                let mut deliveries = VecDeque::from([first?]);
                while deliveries.len() < BATCH_MAX {
                    match consumer.next().now_or_never() {
                        Some(Some(d)) => deliveries.push_back(d?),
                        Some(None) => anyhow::bail!("the broker cancelled the consumer"),
                        None => break,
                    }
                }
                let (batch, items) = prepare(deliveries, dedup);
                let ticket = ingest.enqueue(SOURCE, items).await?;
                waiting.push_back(async move { (batch, ticket.wait().await) });
            }
        }
    }
    // Unacknowledged deliveries go back to the queue when the channel closes.
    let _ = conn.close(200, "latch stopping".into()).await;
    Ok(())
}

/// Parses deliveries into readings; duplicates of recently applied ids are skipped.
fn prepare(
    deliveries: VecDeque<lapin::message::Delivery>,
    dedup: &Dedup,
) -> (Batch, Vec<Result<crate::domain::Reading, Rejection>>) {
    let now = now_ms();
    let mut batch = Batch {
        last_tag: 0,
        messages: Vec::with_capacity(deliveries.len()),
        ids: Vec::new(),
        dup_count: 0,
    };
    let mut items = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        batch.last_tag = d.delivery_tag;
        let value: Result<serde_json::Value, _> = serde_json::from_slice(&d.data);
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_string())
            .or_else(|| value.as_ref().ok()?.get("id")?.as_str().map(str::to_string));
        if let Some(id) = &id {
            if dedup.contains(id) {
                batch.dup_count += 1;
                continue;
            }
            batch.ids.push(id.clone());
        }
        items.push(match value {
            Ok(v) => reading::parse_value(&v, now),
            Err(e) => Err(Rejection::new(
                RejectCode::MalformedJson,
                format!("malformed JSON: {e}"),
            )),
        });
        batch.messages.push((d.data, d.properties));
    }
    (batch, items)
}

/// Dead-letters the batch's rejected messages (waiting for the broker's confirms), then
/// acknowledges the whole batch at once.
async fn finish(
    ch: &Channel,
    settings: &Settings,
    dedup: &mut Dedup,
    batch: Batch,
    report: Report,
) -> anyhow::Result<()> {
    let mut confirms = Vec::with_capacity(report.rejected.len());
    for (i, rej) in &report.rejected {
        let (body, props) = &batch.messages[*i];
        let mut headers = props.headers().clone().unwrap_or_default();
        headers.insert(
            ShortString::from(REASON_HEADER),
            AMQPValue::LongString(LongString::from(rej.code.as_str())),
        );
        headers.insert(
            ShortString::from(ERROR_HEADER),
            AMQPValue::LongString(LongString::from(rej.message.as_str())),
        );
        let props = props.clone().with_headers(headers).with_delivery_mode(2);
        confirms.push(
            ch.basic_publish(
                "".into(),
                settings.dlq().into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await?,
        );
        metrics::counter!("latch_amqp_dead_lettered_total", "reason" => rej.code.as_str())
            .increment(1);
    }
    for c in confirms {
        let confirmation = c.await?;
        anyhow::ensure!(
            !confirmation.is_nack(),
            "RabbitMQ refused a dead-lettered message"
        );
    }
    if !report.rejected.is_empty() {
        tracing::debug!(
            count = report.rejected.len(),
            dlq = %settings.dlq(),
            "Dead-lettered readings that cannot apply."
        );
    }
    ch.basic_ack(batch.last_tag, BasicAckOptions { multiple: true })
        .await?;
    if batch.dup_count > 0 {
        metrics::counter!("latch_amqp_duplicates_total").increment(batch.dup_count as u64);
    }
    for id in batch.ids {
        dedup.insert(id);
    }
    Ok(())
}
