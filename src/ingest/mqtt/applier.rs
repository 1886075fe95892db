//! The applier: batches publishes into the engine in arrival order through the shared
//! [`Pipeline`] and acknowledges, in order, what is durable.
//!
//! A failed commit poisons its connection: what came before the first uncommitted publish
//! is acknowledged, nothing after it is, no further publish of that connection is
//! applied, and the event loop is asked to reconnect (after a growing delay) so that the
//! broker resends the rest. Publishes of a newer connection wait until every batch of the
//! older ones is back: only then is it known which of them committed without being
//! acknowledged ([`Resent`]), and their resends are acknowledged without being applied.
//! Each connection's batches are one engine sequence, so nothing of a sensor commits
//! behind a reading of it that did not.
//!
//! At a stop it takes nothing more into the engine and finishes what the engine holds;
//! then, while publishes that committed wait for their resend, it acknowledges the
//! broker's resends on the current connection (the event loop reconnects at once for
//! them) without applying anything, for at most [`SETTLE_AT_STOP`]. What is still
//! unacknowledged after that is handed back, for the store.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use futures::FutureExt;
use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::mpsc;

use super::resent::Resent;
use super::{Inbound, Link, parse_publish};
use crate::ingest::next_backoff;
use crate::ingest::pipeline::{Done, Pipeline};
use crate::telemetry::families;

/// Longest a stop waits for the broker's resends of committed publishes.
pub(super) const SETTLE_AT_STOP: Duration = Duration::from_secs(5);

/// A batch in the engine.
struct Batch {
    /// The connection its publishes came on.
    generation: u64,
    publishes: Vec<Publish>,
    /// The publish of each item handed to the engine, in order. The other publishes are
    /// resends of committed ones, acknowledged in their place without being applied.
    applied: Vec<usize>,
}

impl Batch {
    /// How many publishes, from the start, may be acknowledged when `settled` items are.
    fn acknowledgeable(&self, settled: usize) -> usize {
        self.applied
            .get(settled)
            .copied()
            .unwrap_or(self.publishes.len())
    }
}

/// What [`run`] keeps between batches.
struct Applier {
    filter: String,
    client: AsyncClient,
    link: Arc<Link>,
    reconnect: mpsc::UnboundedSender<(u64, Duration)>,
    pipeline: Pipeline<Batch>,
    /// The connection of each batch in the pipeline, oldest first.
    waiting: VecDeque<u64>,
    /// The connection whose batches the pipeline's sequence holds.
    sequence_of: u64,
    /// Publishes of this connection number or older are neither applied nor acknowledged:
    /// a commit failed on it, and the broker resends them on the next one.
    poisoned: u64,
    resent: Resent,
    fail_backoff: Duration,
    last_log: Instant,
}

/// What the applier shares with the event loop.
pub(super) struct Shared {
    /// Acknowledgements go through it (the event loop writes them).
    pub client: AsyncClient,
    pub link: Arc<Link>,
    /// Asks the event loop to drop connection number `.0` and wait `.1` before the next.
    pub reconnect: mpsc::UnboundedSender<(u64, Duration)>,
}

/// Applies and acknowledges until `stop` (or until `rx` closes), starting from what a
/// stopped session left unacknowledged (`resent`); returns what this one leaves.
pub(super) async fn run(
    ingest: crate::ingest::Ingest,
    filter: String,
    shared: Shared,
    mut rx: mpsc::UnboundedReceiver<Inbound>,
    resent: Resent,
    stop: CancellationToken,
) -> Resent {
    let Shared {
        client,
        link,
        reconnect,
    } = shared;
    let mut a = Applier {
        filter,
        client,
        link,
        reconnect,
        pipeline: Pipeline::new(ingest, crate::domain::Source::Mqtt, super::PIPELINE),
        waiting: VecDeque::new(),
        sequence_of: 0,
        poisoned: 0,
        resent,
        fail_backoff: Duration::ZERO,
        last_log: Instant::now() - Duration::from_secs(2),
    };
    // An inbound taken but not yet handled: it belongs to a newer connection than a batch
    // still waiting.
    let mut held: Option<Inbound> = None;
    let mut open = true;
    while (open || held.is_some() || !a.pipeline.is_empty()) && !stop.is_cancelled() {
        if a.pipeline.has_room()
            && let Some(h) = held.take_if(|h| !a.older_waiting(h.generation()))
        {
            held = a.take(h, &mut rx).await;
            continue;
        }
        tokio::select! {
            biased;
            done = a.pipeline.next(), if !a.pipeline.is_empty() => {
                a.finish(done.expect("non-empty")).await;
            }
            _ = stop.cancelled() => {}
            first = rx.recv(), if open && held.is_none() && a.pipeline.has_room() => {
                match first {
                    Some(first) => held = Some(first),
                    None => open = false,
                }
            }
        }
    }
    a.stop(held, &mut rx).await;
    a.resent
}

impl Inbound {
    fn generation(&self) -> u64 {
        match self {
            Inbound::Publish(g, _)
            | Inbound::Subscribed(g)
            | Inbound::Connected(g, _)
            | Inbound::Written(g, _) => *g,
        }
    }
}

impl Applier {
    /// The stop: finishes the batches in the engine, then acknowledges the broker's
    /// resends of committed publishes, applying nothing, until none is left to recognise
    /// or [`SETTLE_AT_STOP`] ran out. Any other publish is left unacknowledged, for the
    /// next session.
    async fn stop(&mut self, held: Option<Inbound>, rx: &mut mpsc::UnboundedReceiver<Inbound>) {
        while let Some(done) = self.pipeline.next().await {
            self.finish(done).await;
        }
        let until = tokio::time::Instant::now() + SETTLE_AT_STOP;
        let mut next = held;
        while !self.resent.is_empty() {
            let inbound = match next.take() {
                Some(i) => i,
                None => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(i)) => i,
                    _ => break,
                },
            };
            match inbound {
                Inbound::Connected(_, false) => self.resent.clear(),
                Inbound::Subscribed(g) => self.resent.resends_in(g),
                Inbound::Written(g, pkid) => self.resent.written(pkid, g),
                Inbound::Publish(g, p) if self.current(g) && self.resent.is_resend(&p) => {
                    families::MQTT_DUPLICATES.counter().increment(1);
                    let _ = self.client.ack(&p).await;
                    self.resent.acknowledged(&p, g);
                }
                _ => {}
            }
        }
    }

    /// Whether a batch of a connection before `g` is still waiting.
    fn older_waiting(&self, g: u64) -> bool {
        self.waiting.front().is_some_and(|w| *w < g)
    }

    fn current(&self, g: u64) -> bool {
        g == self.link.generation() && g > self.poisoned
    }

    /// A batch back from its commit: acknowledge what may be, remember what committed
    /// without being acknowledged, and poison the connection if not all committed.
    async fn finish(&mut self, done: Done<Batch>) {
        self.waiting.pop_front();
        let batch = &done.batch;
        let g = batch.generation;
        let current = self.current(g);
        if let Ok(report) = &done.result
            && let Some((_, rej)) = report.rejected.iter().find(|(_, r)| !r.code.is_transient())
            && self.last_log.elapsed() >= Duration::from_secs(1)
        {
            self.last_log = Instant::now();
            tracing::warn!(count = report.rejected.len(), first = %rej, "MQTT readings rejected.");
        }
        let acked = if current {
            batch.acknowledgeable(done.settled)
        } else {
            0
        };
        for p in &batch.publishes[..acked] {
            let _ = self.client.ack(p).await;
            self.resent.acknowledged(p, g);
        }
        let from = if current { done.settled } else { 0 };
        let now = self.link.generation();
        for i in done.committed(from) {
            self.resent
                .remember(&batch.publishes[batch.applied[i]], now);
        }
        if !done.all_settled() {
            match &done.result {
                Err(e) => tracing::error!(error = %e, "MQTT readings not applied."),
                Ok(_) => tracing::error!(
                    count = batch.applied.len() - done.settled,
                    "MQTT readings not committed."
                ),
            }
            if current {
                self.poisoned = g;
                self.fail_backoff = next_backoff(self.fail_backoff);
                self.link.update(|st| st.stalled = true);
                let _ = self.reconnect.send((g, self.fail_backoff));
            }
        } else if current {
            self.fail_backoff = Duration::ZERO;
            self.link.update(|st| st.stalled = false);
        }
    }

    /// Takes `first` and whatever else has arrived into one batch and hands it to the
    /// engine. Returns an inbound of a newer connection that must wait for the batches of
    /// older ones (this one's included) to come back.
    async fn take(
        &mut self,
        first: Inbound,
        rx: &mut mpsc::UnboundedReceiver<Inbound>,
    ) -> Option<Inbound> {
        let mut next = Some(first);
        let mut held = None;
        let mut batch = Batch {
            generation: 0,
            publishes: Vec::new(),
            applied: Vec::new(),
        };
        let mut subscribed = None;
        while let Some(inbound) = next.take() {
            let g = inbound.generation();
            if !batch.publishes.is_empty() && batch.generation < g {
                // A newer connection began: the broker resends what the older one left
                // unacknowledged, so none of it is applied.
                batch.publishes.clear();
                batch.applied.clear();
            }
            if self.older_waiting(g) {
                held = Some(inbound);
                break;
            }
            match inbound {
                Inbound::Connected(_, session_present) => {
                    if !session_present {
                        // The broker kept nothing of ours: nothing will be resent.
                        self.resent.clear();
                    }
                }
                Inbound::Subscribed(g) => {
                    self.resent.resends_in(g);
                    subscribed = Some(g);
                    break;
                }
                Inbound::Written(g, pkid) => self.resent.written(pkid, g),
                Inbound::Publish(g, p) => {
                    if !self.current(g) {
                        // The broker resends it on the current connection.
                    } else if p.retain {
                        families::MQTT_RETAINED_IGNORED.counter().increment(1);
                        let _ = self.client.ack(&p).await;
                    } else {
                        if !self.resent.is_resend(&p) {
                            batch.applied.push(batch.publishes.len());
                        } else {
                            families::MQTT_DUPLICATES.counter().increment(1);
                        }
                        batch.generation = g;
                        batch.publishes.push(*p);
                    }
                }
            }
            if batch.publishes.len() < super::BATCH_MAX {
                next = rx.recv().now_or_never().flatten();
            }
        }
        if !batch.publishes.is_empty() {
            let g = batch.generation;
            if g != self.sequence_of {
                // Nothing older waits (see above): a new connection, a new sequence.
                self.pipeline.new_sequence();
                self.sequence_of = g;
            }
            let now = self.pipeline.now();
            let items = batch
                .applied
                .iter()
                .map(|&i| {
                    let p = &batch.publishes[i];
                    parse_publish(
                        &self.filter,
                        &String::from_utf8_lossy(&p.topic),
                        &p.payload,
                        now,
                    )
                })
                .collect();
            match self.pipeline.push(batch, items, now).await {
                Ok(()) => self.waiting.push_back(g),
                // Only when the engine is closing; nothing acknowledged.
                Err(e) => tracing::error!(error = %e, "MQTT readings not applied."),
            }
        }
        if let Some(g) = subscribed {
            // Nothing of this connection waiting: whatever failed before was not resent,
            // so nothing is left to retry.
            let idle = !self.waiting.contains(&g);
            self.link.update(|st| {
                if st.generation == g {
                    st.subscribed = true;
                    if idle {
                        st.stalled = false;
                    }
                }
            });
        }
        held
    }
}
