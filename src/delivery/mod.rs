//! Reliable, ordered webhook delivery from the durable outbox.
//!
//! The dispatcher keeps an in-memory index of pending notifications, rebuilt from the store
//! at start. Notifications queue in *lanes*, one per (client, sensor); only a lane's head is
//! ever in flight, which is what guarantees a client never sees an older state of a sensor
//! after a newer one. A timer heap holds each idle lane's next due time. Due heads wait in
//! `ready` until the global and per-client limits admit them, and are then claimed from
//! the store in batches: the claim leases them, reads URL and secret from the registry
//! *now*, and cancels those whose client is gone or no longer owns the sensor. Heads are
//! admitted up to [`lanes::CLAIM_AHEAD`] times the concurrency limits (more on a server
//! database), so the next claimed
//! head is ready the moment a request ends; semaphores hold the requests themselves to the
//! limits.
//! Results go to a recorder task that writes attempts and verdicts in batches.
//!
//! Memory follows the work *pending*, never the work done (see [`lanes`]): a week of
//! deliveries leaves the dispatcher as small as it started (`latch bench soak` measures
//! it).
//!
//! Layout: [`lanes`] is the ordering as a pure state machine (what is due, what the limits
//! admit, what an answer does to a lane); the policy it applies is
//! [`crate::domain::policy`]; `dispatch.rs` is the loop that feeds it and carries out its
//! answers. This file starts that loop and wires it to the tasks around it: `claimer.rs`
//! (claims and sends), `recorder.rs` (writes outcomes), `sweeper.rs` (finds work on a
//! shared store); `sender.rs` makes one attempt, a webhook's POST or, for a broker
//! destination, a publish through [`broker`]; [`attempt`] builds the bodies, and
//! [`catalog`] declares the schema of each.

mod answer;
pub mod attempt;
mod auth;
pub mod broker;
pub mod catalog;
mod claimer;
mod client_slots;
pub mod destination;
mod dispatch;
pub mod guard;
mod lanes;
pub mod progress;
mod rates;
mod receivers;
mod recorder;
pub mod retry;
pub mod sender;
pub mod signing;
mod sweeper;
pub mod tls;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::domain::{Millis, NotificationRef};
use crate::store::{Outbox, Registry, Store};
use crate::telemetry::families;
use claimer::{Sending, claimer};
use dispatch::{BatchDone, Cmd, Core};
use recorder::recorder;
use retry::RetryPolicy;
use sweeper::sweeper;

/// Errors of the delivery layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// Settings of the dispatcher.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: RetryPolicy,
    pub timeout: Duration,
    pub concurrency: usize,
    pub client_concurrency: u32,
    /// This process's name on leases.
    pub node: String,
    /// Where due times, leases and attempts read the time.
    pub clock: Clock,
    /// Which destinations webhooks may go to (the SSRF guard).
    pub guard: Arc<guard::Guard>,
    /// A client whose every attempt failed for this long is disabled.
    pub disable_after: Duration,
    /// Cluster mode: which sensors' notifications this node delivers (those of the
    /// partitions it serves). `None`: all.
    pub serves: Option<Serves>,
    /// Cluster mode: where clients' `rate_limit` slots are leased from, so a limit holds
    /// for the whole cluster ([`rates`]). `None`: each client paced by this node alone.
    pub rate_grants: Option<RateGrants>,
    /// Where delivered and failed attempts are counted for the console's charts.
    pub recent: Option<Arc<crate::telemetry::recent::Recent>>,
    /// Where attempts go out; `None`: the network ([`transport::Network`]). The
    /// simulation puts its receivers here.
    pub transport: Option<Arc<dyn transport::Transport>>,
    /// Other nodes write the store too: the dispatcher looks for work it was not handed
    /// (sweeps), and claims run side by side.
    pub shared: bool,
}

/// Where a cluster leases clients' rate slots (the cluster's store).
#[derive(Clone)]
pub struct RateGrants(pub Arc<dyn crate::store::ClusterStore>);

impl std::fmt::Debug for RateGrants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RateGrants(..)")
    }
}

/// Whether this node delivers a sensor's notifications (cluster mode: it serves the
/// sensor's partition). Sweeps of the shared store keep only those.
#[derive(Clone)]
pub struct Serves(pub Arc<dyn Fn(crate::domain::SensorId) -> bool + Send + Sync>);

impl std::fmt::Debug for Serves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Serves(..)")
    }
}

impl Settings {
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            policy: RetryPolicy::from_config(c),
            timeout: c.delivery_timeout,
            concurrency: c.delivery_concurrency as usize,
            client_concurrency: c.delivery_client_concurrency,
            node: format!("latch-{}", ulid::Ulid::new()),
            clock: Clock::wall(),
            guard: Arc::new(guard::Guard::from_config(c)),
            disable_after: c.endpoint_disable_after,
            serves: None,
            rate_grants: None,
            recent: None,
            transport: None,
            shared: false,
        }
    }

    /// How long a claim holds a notification: three attempts' timeouts and a margin for
    /// recording the result; a lease only runs out when its holder is gone. A head claimed
    /// ahead that waited for a request slot until too little of it is left is claimed
    /// again rather than sent (`claimer`).
    fn lease(&self) -> Millis {
        3 * self.timeout.as_millis() as Millis + 5_000
    }

    /// Lease an attempt needs left when it starts: its timeout and the margin for
    /// recording its result.
    fn attempt_span(&self) -> Millis {
        self.timeout.as_millis() as Millis + 5_000
    }
}

/// Handle to the dispatcher; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    tx: mpsc::UnboundedSender<Cmd>,
    /// Where [`Dispatcher::look_for_pending`] reads.
    outbox: Arc<dyn Outbox>,
    /// Other nodes write the store too ([`Settings::shared`]).
    shared: bool,
    /// Asks the sweeper for a full sweep now (a partition was taken over).
    sweep: Arc<tokio::sync::Notify>,
    /// What a test request needs: the attempts' own client, guard and timeout.
    test: Arc<Tester>,
}

/// Sends `client.test` notifications ([`Dispatcher::test`]).
struct Tester {
    /// The dispatcher's HTTP clients and tokens.
    urls: Arc<sender::Receivers>,
    guard: Arc<guard::Guard>,
    timeout: Duration,
    clock: Clock,
}

impl Dispatcher {
    /// Schedules notifications a manual retry put back, whichever node serves their
    /// sensors: this node's claims keep their lanes in order. A commit's go through
    /// [`Dispatcher::deliver_served`].
    pub fn deliver(&self, refs: Vec<NotificationRef>) {
        if !refs.is_empty() {
            let _ = self.tx.send(Cmd::Deliver(refs));
        }
    }

    /// Schedules notifications made by a commit, or by a round that decides for the whole
    /// cluster (sites, ended silences): only those of sensors this node serves. The node
    /// serving the others finds them at its next sweep. Queued here, a lane that had just
    /// moved away could start again on this node while its older head was still out (or
    /// its failed attempt not yet written, which leaves it leased here, so this node's
    /// claim let the newer one pass it): the newer notification went first, and the older
    /// one after it from the node serving it now (simulation seed 2022106: a commit under
    /// way as its partition moved).
    pub fn deliver_served(&self, refs: Vec<NotificationRef>) {
        if !refs.is_empty() {
            let _ = self.tx.send(Cmd::DeliverServed(refs));
        }
    }

    /// A client was enabled: its lanes parked while it was disabled go again, with its
    /// `pending` notifications as the store has them (queued where missing).
    pub fn resume(&self, client_id: &str, pending: Vec<NotificationRef>) {
        let _ = self.tx.send(Cmd::Resume(Arc::from(client_id), pending));
    }

    /// Takes up the pending notifications with an outbox seq above `after_seq` that it
    /// was never handed (a commit whose answer was lost made them): read from the store in
    /// a task of its own, queued where missing.
    /// On a shared store the sweeper finds them: it is asked to sweep now.
    pub fn look_for_pending(&self, after_seq: i64) {
        if self.shared {
            self.sweep_now();
            return;
        }
        let (outbox, tx) = (self.outbox.clone(), self.tx.clone());
        tokio::spawn(async move {
            match outbox.load_pending(after_seq).await {
                Ok(refs) => {
                    let _ = tx.send(Cmd::Deliver(refs));
                }
                Err(e) => tracing::warn!(error = %e,
                    "Could not look for the notifications of a commit whose outcome is unknown; they go out at the next start."),
            }
        });
    }

    /// Looks for every pending notification of the sensors this node serves now, at once:
    /// after taking partitions over, their backlog is delivered without waiting for the
    /// next full sweep.
    pub fn sweep_now(&self) {
        self.sweep.notify_one();
    }

    /// Sends one signed `client.test` to `client` now, exactly as an attempt goes out
    /// (the SSRF guard, the signing, the delivery timeout), and answers what happened.
    /// Not an outbox notification: nothing is stored, retried or counted as an attempt.
    pub async fn test(&self, client: &crate::domain::Client) -> attempt::AttemptResult {
        let t = &self.test;
        sender::send_test(&t.urls, &t.guard, client, t.timeout, t.clock.now()).await
    }

    /// A client's `rate_limit` was set or changed (`None`: lifted).
    pub fn set_rate_limit(&self, client_id: &str, per_second: Option<u32>) {
        let _ = self.tx.send(Cmd::Rate(Arc::from(client_id), per_second));
    }

    /// A client's batching was set or changed (`None`: one request a notification).
    pub fn set_batch(&self, client_id: &str, batch: Option<crate::domain::client::Batch>) {
        let _ = self.tx.send(Cmd::Batch(Arc::from(client_id), batch));
    }

    /// The sensors `moved` names are no longer served here (cluster mode: their partition
    /// was handed over, lost, or given up at a stop). Their lanes are dropped at once: no
    /// new attempt starts for them here and no retry timer stays (the node serving them
    /// now takes them from the store); heads claimed but not yet sent are given back, and
    /// an attempt already in flight finishes and is recorded as it happened.
    pub fn moved(&self, moved: Serves) {
        let _ = self.tx.send(Cmd::Moved(moved));
    }

    /// A client was deleted: heads of its lanes claimed but still waiting for a request
    /// slot are withdrawn (their leases go back, and the next claim finds the client gone
    /// and cancels them), so nothing starts to it after its deletion. An attempt already
    /// sent ends as it goes.
    pub fn client_gone(&self, client_id: &str) {
        let _ = self.tx.send(Cmd::ClientGone(Arc::from(client_id)));
    }

    /// What this dispatcher holds of `client`'s lanes, in words: for a person reading why
    /// something did not go (the simulation prints it beside a failure).
    pub async fn describe(&self, client: &str) -> String {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Cmd::Describe(Arc::from(client), tx));
        rx.await.unwrap_or_else(|_| "the dispatcher stopped".into())
    }

    /// Starts the dispatcher with the store's pending notifications. It stops when `stop`
    /// is cancelled, letting in-flight attempts finish within `grace`.
    pub async fn start(
        store: Arc<dyn Store>,
        settings: Settings,
        stop: CancellationToken,
        grace: Duration,
        tracker: &TaskTracker,
    ) -> anyhow::Result<Self> {
        let http =
            receivers::http_client(&settings.guard, settings.client_concurrency as usize, None)
                .map_err(anyhow::Error::msg)?;
        let urls = Arc::new(sender::Receivers::new(
            http.clone(),
            settings.guard.clone(),
            settings.client_concurrency as usize,
        ));
        let test = Arc::new(Tester {
            urls: urls.clone(),
            guard: settings.guard.clone(),
            timeout: settings.timeout,
            clock: settings.clock.clone(),
        });
        let mut pending = store.load_pending(i64::MIN).await?;
        if let Some(Serves(serves)) = &settings.serves {
            pending.retain(|r| serves(r.sensor_id));
        }
        // The slices of the store delivery's tasks use.
        let (outbox, registry): (Arc<dyn Outbox>, Arc<dyn Registry>) = (store.clone(), store);
        let (tx, rx) = mpsc::unbounded_channel();
        let (rec_tx, rec_rx) = mpsc::unbounded_channel();
        tracker.spawn(recorder(
            outbox.clone(),
            registry.clone(),
            rec_rx,
            settings.clock.clone(),
            settings.disable_after.as_millis() as Millis,
            tx.clone(),
        ));
        let settings = Arc::new(settings);
        let (claims, claims_rx) = mpsc::unbounded_channel();
        let sweep_soon = Arc::new(tokio::sync::Notify::new());
        let sends = Arc::new(Semaphore::new(settings.concurrency));
        let cut = CancellationToken::new();
        let transport = match settings.transport.clone() {
            Some(t) => t,
            None => Arc::new(transport::Network {
                http,
                brokers: broker::Brokers::new(
                    settings.guard.clone(),
                    settings.timeout,
                    stop.clone(),
                    grace,
                    tracker.clone(),
                ),
                guard: settings.guard.clone(),
                urls,
            }),
        };
        tracker.spawn(claimer(
            outbox.clone(),
            Sending {
                transport,
                settings: settings.clone(),
                sends,
                tx: tx.clone(),
                tracker: tracker.clone(),
                cut: cut.clone(),
                sweep_soon: sweep_soon.clone(),
            },
            claims_rx,
        ));
        let mut core = Core::new(&settings, rec_tx, claims, settings.shared, cut);
        if let Some(RateGrants(grants)) = &settings.rate_grants {
            core.lanes.share_rates();
            core.grants = Some((grants.clone(), tx.clone()));
        }
        for c in clients(registry.as_ref()).await? {
            if let Some(rate) = c.rate_limit {
                core.lanes.set_rate(&c.id, Some(rate));
            }
            if let Some(batch) = crate::domain::client::effective_batch(c.batch, &c.url) {
                core.lanes.set_batch(&c.id, Some(batch));
            }
        }
        tracing::info!(
            pending = pending.len(),
            "Dispatcher loaded pending notifications."
        );
        core.add(pending, core.clock.now());
        families::CLIENTS_DISABLED
            .gauge()
            .set(registry.count_disabled_clients().await? as f64);
        // Right away, not at the first event: a restart with a backlog shows it at once.
        families::NOTIFICATIONS_PENDING
            .gauge()
            .set(core.lanes.pending() as f64);
        progress::pending(core.lanes.pending());
        let sweep = Arc::new(tokio::sync::Notify::new());
        if settings.shared {
            tracker.spawn(sweeper(
                outbox.clone(),
                registry,
                tx.clone(),
                settings.serves.clone(),
                sweep.clone(),
                sweep_soon,
                settings.clock.clone(),
                stop.clone(),
            ));
        }
        tracker.spawn(core.run(rx, stop, grace));
        Ok(Self {
            tx,
            outbox,
            shared: settings.shared,
            sweep,
            test,
        })
    }
}

/// Every client with a `rate_limit` or batching, so the first requests after a start
/// follow them too.
async fn clients(store: &dyn Registry) -> crate::store::Result<Vec<crate::domain::Client>> {
    let mut out = Vec::new();
    let mut page = crate::store::PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store.list_clients(page.clone(), None).await?;
        out.extend(
            p.items
                .into_iter()
                .filter(|c| c.rate_limit.is_some() || c.batch.is_some()),
        );
        match p.next {
            Some(next) => page.after = Some(next),
            None => return Ok(out),
        }
    }
}

/// The dispatcher's maps, looked up several times a notification: foldhash rather than
/// SipHash, whose hashing of client ids was ~5 % of a webhook's instructions (BENCHMARKS.md,
/// tenth pass). Their keys are client ids latch made and sensors registered through the API.
use crate::hashing::{FastMap, FastSet};

#[cfg(test)]
mod tests;
