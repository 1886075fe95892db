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
//!
//! In a cluster, [`exchange`] consumes the consistent-hash exchange's partition queues
//! beside it, on every node, with the same loop ([`consume`]).

mod consume;
pub mod exchange;

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{FieldTable, LongString};
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use super::{Dedup, Ingest, Sources, paused};

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
        let Err(e) = result else { break };
        let what = format!("queue {}", settings.queue);
        if !paused(SOURCE, &what, &e.to_string(), &mut backoff, &stop).await {
            break;
        }
    }
    tracing::info!("RabbitMQ ingest stopped.");
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
    let result = async {
        let ch = conn.create_channel().await?;
        ch.queue_declare(settings.dlq().into(), durable(), FieldTable::default())
            .await?;
        ch.queue_declare(
            settings.queue.clone().into(),
            durable(),
            FieldTable::default(),
        )
        .await?;
        let queue = consume::Queue {
            name: &settings.queue,
            dlq: &settings.dlq(),
            prefetch: PREFETCH,
        };
        consume::consume(&ch, queue, ingest, stop, dedup, backoff, || {
            sources.set(SOURCE, true);
            tracing::info!(queue = %settings.queue, "RabbitMQ ingest consuming.");
        })
        .await
    }
    .await;
    let reason = if result.is_ok() {
        "latch stopping"
    } else {
        "latch reconnects"
    };
    let _ = conn.close(200, reason.into()).await;
    result
}

/// Queues and the exchange outlive latch's connections: what was published while latch
/// was away waits for it.
fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
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
