//! RabbitMQ ingest: consumes `amqp_queue`, acknowledges only after the readings' effects are
//! durable, and moves messages that can never apply to `{queue}.dlq` with the reason in a
//! header.
//!
//! Deliveries are taken in batches of what has arrived (up to [`BATCH_MAX`]) and handed to
//! the engine in arrival order through the shared `Pipeline`; up to [`PIPELINE`] batches
//! wait for their group commit at once, and each is acknowledged with one
//! `basic.ack multiple` in order. When a commit
//! fails (the whole batch, or only some readings of it, rejected as transient), the
//! messages before the first uncommitted one are acknowledged and the session ends: the
//! connection closes, RabbitMQ requeues everything else in its original order, and latch
//! reconnects. A transient rejection is never dead-lettered. Redelivering in order keeps
//! per-sensor order: a later reading that was already applied is applied again after the
//! earlier one, so the state ends where the publisher left it.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use super::pipeline::{Done, Pipeline};
use super::{Dedup, Ingest, Sources, next_backoff};
use crate::domain::{Millis, RejectCode, Rejection, reading};
use crate::telemetry::families;

/// Unacknowledged deliveries RabbitMQ may push ahead of our commits.
pub const PREFETCH: u16 = 8192;
/// Most deliveries handed to the engine as one batch.
pub const BATCH_MAX: usize = 2000;
/// Batches waiting for their commit at once.
pub const PIPELINE: usize = 4;
/// Message ids remembered for dedup.
pub const DEDUP_WINDOW: usize = 100_000;

pub(crate) const SOURCE: &str = "amqp";

/// Header naming why a message was dead-lettered (the rejection code).
pub const REASON_HEADER: &str = "x-latch-reason";
/// Header with the human-readable rejection message.
pub const ERROR_HEADER: &str = "x-latch-error";
/// Most bytes of [`ERROR_HEADER`]. A rejection message can quote a field of the message
/// (`data must be 0 or 1, got …`), and all headers must fit in one AMQP frame
/// (`frame_max`, 128 KiB on RabbitMQ): an unbounded one makes the dead-letter publish
/// fail, and the message would be redelivered forever.
pub const ERROR_HEADER_MAX: usize = 1024;

/// Refuses what this build cannot connect to. There is no TLS here: an `amqps://` URL is
/// refused at start rather than silently reached in plain text.
pub fn check_url(url: &str) -> anyhow::Result<()> {
    if url.starts_with("amqps://") {
        anyhow::bail!(
            "invalid setting `amqp_url`: amqps:// (TLS) is not supported by this build; \
             use amqp:// on a trusted network or behind a TLS-terminating tunnel"
        );
    }
    if !url.starts_with("amqp://") {
        anyhow::bail!("invalid setting `amqp_url`: must start with amqp://");
    }
    Ok(())
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` marking the cut.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

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
/// The source counts as down until the first session consumes (the caller marks it so
/// before spawning this).
pub async fn run(ingest: Ingest, settings: Settings, sources: Sources, stop: CancellationToken) {
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
                families::SOURCE_RECONNECTS
                    .counter_with(&[("source", SOURCE)])
                    .increment(1);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
    }
    tracing::info!("RabbitMQ ingest stopped.");
}

/// A delivery handed to the engine, kept to acknowledge or dead-letter it.
struct Message {
    tag: u64,
    body: Vec<u8>,
    props: BasicProperties,
    /// Its AMQP `message_id`, remembered for dedup once it is durably applied.
    id: Option<String>,
}

/// A batch handed to the engine, waiting for its commit.
struct Batch {
    last_tag: u64,
    /// One per item handed to the engine, in the same order.
    messages: Vec<Message>,
    /// Duplicates skipped (acknowledged with the batch, not applied).
    dup_count: usize,
}

/// One connection's life: declare, consume, apply, acknowledge. The connection is closed
/// on every way out, so what was not acknowledged goes back to the queue at once.
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
    let result = consume(&conn, ingest, settings, sources, stop, dedup, backoff).await;
    let reason = if result.is_ok() {
        "latch stopping"
    } else {
        "latch reconnects"
    };
    let _ = conn.close(200, reason.into()).await;
    result
}

async fn consume(
    conn: &Connection,
    ingest: &Ingest,
    settings: &Settings,
    sources: &Sources,
    stop: &CancellationToken,
    dedup: &mut Dedup,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
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
    tracing::info!(queue = %settings.queue, "RabbitMQ ingest consuming.");

    // Message ids of batches still waiting for their commit: a copy arriving meanwhile is
    // a duplicate too. Per session, since a new session gets every unacknowledged one again.
    let mut in_flight = HashSet::new();
    let mut pipeline = Pipeline::new(ingest.clone(), SOURCE, PIPELINE);
    let result: anyhow::Result<()> = async {
        let mut stopping = false;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled(), if !stopping => {
                    stopping = true;
                    if pipeline.is_empty() { break; }
                }
                done = pipeline.next(), if !pipeline.is_empty() => {
                    let done: Done<Batch> = done.expect("non-empty");
                    finish(&ch, settings, dedup, &mut in_flight, done).await?;
                    // Reset only by a commit that went through, so a store that keeps
                    // failing meets a growing delay rather than a reconnect every 100 ms.
                    *backoff = Duration::ZERO;
                    if stopping && pipeline.is_empty() { break; }
                }
                first = consumer.next(), if !stopping && pipeline.has_room() => {
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
                    let now = ingest.now();
                    let (batch, items) = prepare(deliveries, dedup, &mut in_flight, now);
                    pipeline.push(batch, items, now).await?;
                }
            }
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        // The session ends on a failed commit or a broker error, with batches still in the
        // engine that may commit (in part: their sequence is cut where one fails). What
        // commits is acknowledged if the channel still works, and remembered either way,
        // so the broker's redelivery never applies it again.
        while let Some(done) = pipeline.next().await {
            settle_committed(&ch, dedup, &done.batch, &done.committed(0)).await;
        }
    }
    result
}

/// Parses deliveries into readings. A message whose AMQP `message_id` was recently applied
/// (or waits in an earlier batch) is skipped. Only `message_id` counts: the body's fields
/// are the reading contract, and a JSON `"id"` is not part of it.
fn prepare(
    deliveries: VecDeque<lapin::message::Delivery>,
    dedup: &Dedup,
    in_flight: &mut HashSet<String>,
    now: Millis,
) -> (Batch, Vec<Result<crate::domain::Reading, Rejection>>) {
    let mut batch = Batch {
        last_tag: 0,
        messages: Vec::with_capacity(deliveries.len()),
        dup_count: 0,
    };
    let mut items = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        batch.last_tag = d.delivery_tag;
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_string());
        if let Some(id) = &id
            && (dedup.contains(id) || !in_flight.insert(id.clone()))
        {
            batch.dup_count += 1;
            continue;
        }
        items.push(match serde_json::from_slice::<serde_json::Value>(&d.data) {
            Ok(v) => reading::parse_value(&v, now),
            Err(e) => Err(Rejection::new(
                RejectCode::MalformedJson,
                format!("malformed JSON: {e}"),
            )),
        });
        batch.messages.push(Message {
            tag: d.delivery_tag,
            body: d.data,
            props: d.properties,
            id,
        });
    }
    (batch, items)
}

/// Dead-letters the settled part's rejected messages (waiting for the broker's confirms),
/// then acknowledges that part at once. Errs, ending the session, when some of the batch
/// did not commit: the rest comes back in order on the next session.
async fn finish(
    ch: &Channel,
    settings: &Settings,
    dedup: &mut Dedup,
    in_flight: &mut HashSet<String>,
    done: Done<Batch>,
) -> anyhow::Result<()> {
    let batch = &done.batch;
    for id in batch.messages.iter().filter_map(|m| m.id.as_ref()) {
        in_flight.remove(id);
    }
    // Before anything can fail on the broker's side: a committed message redelivered
    // because its acknowledgement never went out is recognised.
    for i in done.committed(0) {
        if let Some(id) = &batch.messages[i].id {
            dedup.insert(id.clone());
        }
    }
    let (settled, all_settled) = (done.settled, done.all_settled());
    let mut confirms = Vec::new();
    for (i, rej) in done.settled_rejections() {
        let m = &batch.messages[*i];
        let mut headers = m.props.headers().clone().unwrap_or_default();
        headers.insert(
            ShortString::from(REASON_HEADER),
            AMQPValue::LongString(LongString::from(rej.code.as_str())),
        );
        headers.insert(
            ShortString::from(ERROR_HEADER),
            AMQPValue::LongString(LongString::from(bounded(&rej.message, ERROR_HEADER_MAX))),
        );
        let props = m.props.clone().with_headers(headers).with_delivery_mode(2);
        confirms.push(
            ch.basic_publish(
                "".into(),
                settings.dlq().into(),
                BasicPublishOptions::default(),
                &m.body,
                props,
            )
            .await?,
        );
        families::AMQP_DEAD_LETTERED
            .counter_with(&[("reason", rej.code.as_str())])
            .increment(1);
    }
    for c in confirms {
        let confirmation = c.await?;
        anyhow::ensure!(
            !confirmation.is_nack(),
            "RabbitMQ refused a dead-lettered message"
        );
    }
    let rejected = done
        .result
        .as_ref()
        .map_or(0, |report| report.rejected.len());
    if rejected > 0 {
        tracing::debug!(
            count = rejected,
            dlq = %settings.dlq(),
            "Dead-lettered readings that cannot apply."
        );
    }
    // Acknowledges through the last settled message; when all are settled, through the
    // batch's last delivery, so trailing duplicates go too.
    let ack_through = if all_settled {
        Some(batch.last_tag)
    } else {
        settled.checked_sub(1).map(|i| batch.messages[i].tag)
    };
    if let Some(tag) = ack_through {
        ch.basic_ack(tag, BasicAckOptions { multiple: true })
            .await?;
    }
    if batch.dup_count > 0 {
        families::AMQP_DUPLICATES
            .counter()
            .increment(batch.dup_count as u64);
    }
    for id in batch.messages[..settled]
        .iter()
        .filter_map(|m| m.id.clone())
    {
        dedup.insert(id);
    }
    if !all_settled {
        settle_committed(ch, dedup, batch, &done.committed(settled)).await;
    }
    match done.result {
        Err(e) => {
            Err(anyhow::Error::new(e).context("readings not committed; RabbitMQ redelivers them"))
        }
        Ok(_) if !all_settled => anyhow::bail!(
            "{} of {} readings not committed; RabbitMQ redelivers them",
            batch.messages.len() - settled,
            batch.messages.len()
        ),
        Ok(_) => Ok(()),
    }
}

/// Messages that committed behind the acknowledged prefix (the session is ending on a
/// failure): each is acknowledged on its own, so RabbitMQ requeues only the rest — those
/// without a `message_id` too — and its id is remembered, for when the acknowledgement is
/// lost with the connection. Safe for order: the sequence was cut where a reading failed,
/// so what committed of a sensor all comes before what did not.
async fn settle_committed(ch: &Channel, dedup: &mut Dedup, batch: &Batch, committed: &[usize]) {
    for &i in committed {
        let m = &batch.messages[i];
        if let Some(id) = &m.id {
            dedup.insert(id.clone());
        }
        // Best effort: on a broken channel the id above is what recognises it.
        let _ = ch
            .basic_ack(m.tag, BasicAckOptions { multiple: false })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_at_a_char_boundary() {
        assert_eq!(bounded("short", 10), "short");
        let cut = bounded(&"é".repeat(1000), 101);
        assert!(cut.len() <= 101, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn only_plain_amqp_urls_are_accepted() {
        assert!(check_url("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        let e = check_url("amqps://127.0.0.1").unwrap_err().to_string();
        assert!(e.contains("amqp_url") && e.contains("TLS"), "{e}");
        assert!(check_url("http://127.0.0.1").is_err());
    }
}
