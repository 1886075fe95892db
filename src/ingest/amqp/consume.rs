//! One queue's consumption on one channel: take deliveries in batches, hand them to the
//! engine through the shared `Pipeline`, dead-letter what can never apply, acknowledge
//! the committed prefix. The plain queue (`amqp_queue`) and each of the exchange's
//! partition queues run this same loop; only who declares the queue and when it stops
//! differ.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};
use tokio_util::sync::CancellationToken;

use super::{BATCH_MAX, ERROR_HEADER, ERROR_HEADER_MAX, PIPELINE, REASON_HEADER, bounded};
use crate::domain::{Millis, RejectCode, Rejection, reading};
use crate::ingest::pipeline::{Done, Pipeline};
use crate::ingest::{Dedup, Ingest};
use crate::telemetry::families;

/// What one consumption reads and where its rejects go.
pub(super) struct Queue<'a> {
    pub name: &'a str,
    pub dlq: &'a str,
    /// Unacknowledged deliveries RabbitMQ may push ahead of our commits.
    pub prefetch: u16,
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

/// Consumes `queue` on `ch` (declared by the caller) until `stop`, or until a commit fails
/// or the broker errs (`Err`: the caller closes the channel, so RabbitMQ requeues what was
/// not acknowledged, in order). `consuming` runs once the broker has the consumer. On
/// `stop` it takes no more deliveries, waits for the batches in the engine and
/// acknowledges them: what is left goes back to the queue when the channel closes.
pub(super) async fn consume(
    ch: &Channel,
    queue: Queue<'_>,
    ingest: &Ingest,
    stop: &CancellationToken,
    dedup: &mut Dedup,
    backoff: &mut Duration,
    consuming: impl FnOnce(),
) -> anyhow::Result<()> {
    ch.basic_qos(queue.prefetch, BasicQosOptions::default())
        .await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let tag = format!("latch-{}", ulid::Ulid::new());
    let mut consumer = ch
        .basic_consume(
            queue.name.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    consuming();

    // Message ids of batches still waiting for their commit: a copy arriving meanwhile is
    // a duplicate too. Per session, since a new session gets every unacknowledged one again.
    let mut in_flight = HashSet::new();
    let mut pipeline = Pipeline::new(ingest.clone(), crate::domain::Source::Amqp, PIPELINE);
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
                    finish(ch, queue.dlq, dedup, &mut in_flight, done).await?;
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
            settle_committed(ch, dedup, &done.batch, &done.committed(0)).await;
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
    dlq: &str,
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
                dlq.into(),
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
            dlq = %dlq,
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
