//! Readings in, acknowledgements out. Every source ([`http`], [`amqp`], [`mqtt`])
//! turns its messages into validated readings or rejections and submits them through
//! [`Ingest::submit`], which answers only once the accepted ones are durable and counts
//! each one in `latch_readings_accepted_total` / `latch_readings_rejected_total`.
//!
//! The broker sources run their batches through one acknowledge-after-durable
//! `pipeline`: acknowledge exactly the committed prefix, and on a failure end the session
//! so the broker redelivers the rest in order.

pub mod amqp;
pub mod http;
pub mod mqtt;
mod pipeline;
pub mod sources;

use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use crate::domain::{Millis, Reading, Rejection, Source};
/// What became of a submitted batch: accepted, or rejected with a reason and its index.
pub use crate::engine::Report;
use crate::engine::{self, Engine, Sequence};
use crate::telemetry::events::{Emit, SourcePaused};
use crate::telemetry::families;

/// Errors of ingest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// The store failed a request's `Idempotency-Key` ([`http::submit_idempotent`]).
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Items in the engine, not yet known durable; resolves, once they are, to their report,
/// counted in the metrics. `Err` when nothing could be made durable; a partial failure is
/// a [`Report`] whose failed readings are `store_unavailable` rejections.
pub type Durable = BoxFuture<'static, Result<Report, Error>>;

/// The shared entry point of all sources.
#[derive(Clone)]
pub struct Ingest {
    engine: Engine,
}

impl Ingest {
    /// The time a reading arriving now is stamped with (the engine's clock).
    pub fn now(&self) -> Millis {
        self.engine.now()
    }

    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// Submits already-parsed items; `Err` items are rejections found by the source.
    /// `source` labels the metrics (`http`, `amqp`, `mqtt`); `received_at` is the stamp the
    /// source took when the items arrived (the one it judged their `ts` by), so a reading
    /// is stamped once, at the edge.
    pub async fn submit(
        &self,
        source: Source,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
    ) -> Result<Report, Error> {
        self.enqueue(source, items, received_at).await?.await
    }

    /// [`Ingest::submit`] for a request sent with an `Idempotency-Key` ([`Engine::enqueue_keyed`]).
    pub async fn submit_keyed(
        &self,
        source: Source,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        keyed: crate::store::Keyed,
    ) -> Result<Report, Error> {
        let ticket = self
            .engine
            .enqueue_keyed(items, received_at, source, keyed)
            .await?;
        durable(source, ticket).await
    }

    /// Hands items to the engine without waiting for durability; batches enqueued one
    /// after another are applied in that order.
    pub async fn enqueue(
        &self,
        source: Source,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
    ) -> Result<Durable, Error> {
        let ticket = self.engine.enqueue(items, received_at, source).await?;
        Ok(durable(source, ticket))
    }

    /// [`Ingest::enqueue`] as the next batch of a broker session's `sequence`: nothing of
    /// it commits once an earlier batch did not ([`Sequence`]).
    pub(crate) async fn enqueue_in(
        &self,
        source: Source,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        sequence: &Sequence,
    ) -> Result<Durable, Error> {
        let ticket = self
            .engine
            .enqueue_in(items, received_at, source, sequence)
            .await?;
        Ok(durable(source, ticket))
    }
}

impl Ingest {
    /// Readings another node forwarded because this node serves their partitions: enqueued
    /// here, never forwarded again ([`Engine::enqueue_here`]).
    pub async fn enqueue_forwarded(
        &self,
        source: Source,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        sequence: Option<&Sequence>,
        keyed: Option<&crate::store::Keyed>,
    ) -> Result<engine::Ticket, engine::Error> {
        self.engine
            .enqueue_here(items, received_at, source, sequence, keyed)
            .await
    }
}

/// The ticket's report once durable, counted in the metrics.
fn durable(source: Source, ticket: engine::Ticket) -> Durable {
    Box::pin(async move {
        let report = ticket.wait().await?;
        count(source, &report);
        Ok(report)
    })
}

/// Readings accepted in this process per source, beside `latch_readings_accepted_total`:
/// `latch bench` watches its in-process latch's progress with one atomic load, where a
/// `/metrics` scrape renders every family in latch's own process and slows what it watches.
static ACCEPTED: [AtomicU64; Source::ALL.len()] = [const { AtomicU64::new(0) }; Source::ALL.len()];

/// Readings accepted from `source` since this process started (every latch in it, as the
/// metrics count them too); 0 for a source that is not counted.
pub fn accepted_total(source: &str) -> u64 {
    Source::parse(source).map_or(0, |s| ACCEPTED[s.index()].load(Ordering::Relaxed))
}

/// Counts a durable batch's outcome, per reading, in the metrics.
fn count(source: Source, report: &Report) {
    families::READINGS_ACCEPTED
        .counter_with(&[("source", source.as_str())])
        .increment(report.accepted as u64);
    ACCEPTED[source.index()].fetch_add(report.accepted as u64, Ordering::Relaxed);
    for (_, rej) in &report.rejected {
        families::READINGS_REJECTED
            .counter_with(&[("source", source.as_str()), ("reason", rej.code.as_str())])
            .increment(1);
    }
}

/// Whether each broker source is connected and consuming. A configured source that is
/// down makes `/readyz` answer 503 and shows as `latch_source_up{source} 0`.
#[derive(Clone, Default)]
pub struct Sources {
    up: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, bool>>>,
    /// Told every change of a broker link's state, in order, before anyone can see it
    /// here: the wiring tells the engine, which holds back "lost" for sensors heard through
    /// a broker latch is not connected to.
    on_change: Option<OnChange>,
}

/// What [`Sources::watched`] calls with each change of a broker link's state.
pub type OnChange = std::sync::Arc<dyn Fn(crate::domain::Source, bool) + Send + Sync>;

/// The broker link a source's connection is part of. Both AMQP consumers (the plain queue
/// and, in a cluster, the exchange's partition queues) are latch's link to RabbitMQ: it is
/// up while every one of them is.
pub fn link_of(source: &str) -> Option<crate::domain::Source> {
    use crate::domain::Source;
    match source {
        amqp::SOURCE | amqp::exchange::SOURCE => Some(Source::Amqp),
        mqtt::SOURCE => Some(Source::Mqtt),
        _ => None,
    }
}

/// Whether `link` is up by the sources in `all`; `None` when none of them is part of it.
fn link_state(
    all: &std::collections::BTreeMap<&'static str, bool>,
    link: crate::domain::Source,
) -> Option<bool> {
    let mut of_link = all.iter().filter(|(s, _)| link_of(s) == Some(link));
    let first = of_link.next()?;
    Some(*first.1 && of_link.all(|(_, up)| *up))
}

impl Sources {
    /// Sources that call `on_change` with every change of a broker link's state (it must
    /// not block: it runs under the sources' lock).
    pub fn watched(on_change: OnChange) -> Self {
        Self {
            up: Default::default(),
            on_change: Some(on_change),
        }
    }

    /// Records a source's state.
    pub fn set(&self, source: &'static str, up: bool) {
        let mut all = self.up.lock().expect("sources lock");
        let link = link_of(source);
        let before = link.and_then(|l| link_state(&all, l));
        all.insert(source, up);
        // Told under the lock, so two tasks' changes are told in the order they were made.
        if let (Some(link), Some(on_change)) = (link, &self.on_change) {
            let after = link_state(&all, link).unwrap_or(up);
            if before != Some(after) {
                on_change(link, after);
            }
        }
        drop(all);
        families::SOURCE_UP
            .gauge_with(&[("source", source)])
            .set(if up { 1.0 } else { 0.0 });
    }

    /// Forgets `names`: they were stopped on purpose (cluster mode: another node holds
    /// partition 0 and runs them now), so none counts as down. A link no source of this
    /// node is part of any more counts as up here: this node listens through it no more.
    pub fn forget(&self, names: &[&'static str]) {
        let mut all = self.up.lock().expect("sources lock");
        let links: Vec<_> = names.iter().filter_map(|n| link_of(n)).collect();
        let before: Vec<_> = links.iter().map(|l| link_state(&all, *l)).collect();
        for name in names {
            if all.remove(name).is_some() {
                families::SOURCE_UP
                    .gauge_with(&[("source", *name)])
                    .set(0.0);
            }
        }
        if let Some(on_change) = &self.on_change {
            for (link, before) in links.into_iter().zip(before) {
                let after = link_state(&all, link).unwrap_or(true);
                if before.is_some_and(|b| b != after) {
                    on_change(link, after);
                }
            }
        }
    }

    /// Names of configured sources that are not consuming.
    pub fn down(&self) -> Vec<&'static str> {
        let up = self.up.lock().expect("sources lock");
        up.iter().filter(|(_, u)| !**u).map(|(s, _)| *s).collect()
    }
}

/// A broker source's session failed: counts the reconnect, grows `backoff`, says so in the
/// log with `what` (the queue, exchange or topic), and waits it out. Returns `false` when
/// `stop` came meanwhile. The AMQP consumers and the MQTT event loop share it.
pub(crate) async fn paused(
    source: &'static str,
    what: &str,
    error: &str,
    backoff: &mut std::time::Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> bool {
    *backoff = next_backoff(*backoff);
    SourcePaused {
        source,
        on: what,
        error,
        retry_in: *backoff,
    }
    .emit();
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(*backoff) => true,
    }
}

/// Doubles a reconnect delay from 100 ms up to 10 s.
pub(crate) fn next_backoff(d: std::time::Duration) -> std::time::Duration {
    (d * 2).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(10),
    )
}

/// Ids of recently applied broker messages, so a message redelivered (or published twice)
/// with the same id is applied once. Bounded: the oldest ids are forgotten first.
pub(crate) struct Dedup {
    seen: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
    capacity: usize,
}

impl Dedup {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            seen: Default::default(),
            order: Default::default(),
            capacity,
        }
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.seen.contains(id)
    }

    /// Remembers an id once its message is durably applied.
    pub(crate) fn insert(&mut self, id: String) {
        if self.capacity == 0 || !self.seen.insert(id.clone()) {
            return;
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Source;

    #[test]
    fn dedup_forgets_the_oldest_beyond_capacity() {
        let mut d = Dedup::new(2);
        d.insert("a".into());
        d.insert("b".into());
        d.insert("a".into());
        assert!(d.contains("a") && d.contains("b"));
        d.insert("c".into());
        assert!(!d.contains("a"), "oldest forgotten");
        assert!(d.contains("b") && d.contains("c"));
    }

    #[test]
    fn backoff_grows_to_a_cap() {
        let mut d = std::time::Duration::ZERO;
        d = next_backoff(d);
        assert_eq!(d, std::time::Duration::from_millis(100));
        for _ in 0..20 {
            d = next_backoff(d);
        }
        assert_eq!(d, std::time::Duration::from_secs(10));
    }

    #[test]
    fn watched_sources_tell_each_change_once() {
        let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = told.clone();
        let s = Sources::watched(std::sync::Arc::new(move |source: Source, up| {
            log.lock().unwrap().push((source.as_str(), up));
        }));
        s.set("mqtt", false);
        s.set("mqtt", false);
        s.set("mqtt", true);
        s.set("mqtt", true);
        s.set("amqp", true);
        assert_eq!(
            *told.lock().unwrap(),
            [("mqtt", false), ("mqtt", true), ("amqp", true)]
        );
        assert!(s.down().is_empty());
    }

    /// The plain queue and the exchange's queues are one link to RabbitMQ: down while
    /// either connection is, and a node that stops the plain queue on purpose (partition 0
    /// moved away) is left with the exchange's state alone.
    #[test]
    fn both_amqp_consumers_are_one_link() {
        let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = told.clone();
        let s = Sources::watched(std::sync::Arc::new(move |source: Source, up| {
            log.lock().unwrap().push((source.as_str(), up));
        }));
        s.set("amqp", false);
        s.set("amqp_exchange", false);
        s.set("amqp", true);
        assert_eq!(
            *told.lock().unwrap(),
            [("amqp", false)],
            "the exchange is down still"
        );
        s.set("amqp_exchange", true);
        s.set("amqp", false);
        s.forget(&["amqp", "mqtt"]);
        assert_eq!(
            *told.lock().unwrap(),
            [
                ("amqp", false),
                ("amqp", true),
                ("amqp", false),
                ("amqp", true)
            ],
            "up once the plain queue, the one down, is no longer this node's"
        );
        assert!(s.down().is_empty());
        s.set("amqp_exchange", false);
        s.forget(&["amqp_exchange"]);
        assert_eq!(
            told.lock().unwrap().len(),
            6,
            "a link nobody here listens on is up"
        );
        assert_eq!(told.lock().unwrap()[5], ("amqp", true));
    }

    #[test]
    fn sources_report_the_down_ones() {
        let s = Sources::default();
        s.set("amqp", true);
        s.set("mqtt", false);
        assert_eq!(s.down(), vec!["mqtt"]);
        s.set("mqtt", true);
        assert!(s.down().is_empty());
    }
}
