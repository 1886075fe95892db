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
//! [`crate::domain::policy`]. This file wires it to the tasks around it: `claimer.rs`
//! (claims and sends), `recorder.rs` (writes outcomes), `sweeper.rs` (finds work on a
//! shared store); `sender.rs` makes one attempt, a webhook's POST or, for a broker
//! destination, a publish through [`broker`].

pub mod attempt;
mod auth;
pub mod broker;
mod claimer;
pub mod guard;
mod lanes;
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
use crate::domain::{Millis, NotificationRef, Outcome, Verdict};
use crate::store::{Outbox, Registry, Store};
use crate::telemetry::families;
use crate::telemetry::recent::Measure;
use claimer::{Admission, Admitted, AdmittedBatch, Sending, claimer};
use lanes::{Done, LaneKey, Lanes};
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
    /// Schedules notifications just made durable (or put back by a manual retry).
    pub fn deliver(&self, refs: Vec<NotificationRef>) {
        if !refs.is_empty() {
            let _ = self.tx.send(Cmd::Deliver(refs));
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
        let sweep = Arc::new(tokio::sync::Notify::new());
        if settings.shared {
            tracker.spawn(sweeper(
                outbox.clone(),
                registry,
                tx.clone(),
                settings.serves.clone(),
                sweep.clone(),
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

enum Cmd {
    Deliver(Vec<NotificationRef>),
    /// A client was enabled: its pending notifications.
    Resume(Arc<str>, Vec<NotificationRef>),
    /// A client's rate limit, from the API or read by a claim.
    Rate(Arc<str>, Option<u32>),
    /// What a sweep of a shared store found pending.
    Sweep(Vec<NotificationRef>),
    /// The clients disabled now, as a sweep read them.
    StillDisabled(Vec<Arc<str>>),
    Done(Box<Done>),
    /// What came of a batch's heads.
    BatchDone(Box<BatchDone>),
    /// A client's batching, from the API or read by a claim.
    Batch(Arc<str>, Option<crate::domain::client::Batch>),
    /// Sensors no longer served here ([`Dispatcher::moved`]).
    Moved(Serves),
    /// A client was deleted ([`Dispatcher::client_gone`]).
    ClientGone(Arc<str>),
    /// The recorder wrote the outcomes of these notifications.
    Recorded(Vec<String>),
    /// What the lanes hold of a client ([`Dispatcher::describe`]).
    Describe(Arc<str>, tokio::sync::oneshot::Sender<String>),
    /// A lease of a client's rate slots; `None` when the store could not be asked.
    Granted(Arc<str>, Option<rates::Lease>),
}

/// What came of each head of one batch, in one message: the client's next batch may go.
struct BatchDone {
    client: Arc<str>,
    id: Arc<str>,
    dones: Vec<Done>,
}

/// The dispatcher's loop: feeds the lanes what arrives and the time, and carries out what
/// they answer (admitted heads to the [`claimer`], outcomes to the [`recorder`]).
struct Core {
    lanes: Lanes,
    recorder: mpsc::UnboundedSender<Outcome>,
    /// Heads and batches admitted by the limits, on their way to the [`claimer`].
    claims: mpsc::UnboundedSender<Admission>,
    /// Per client, the requests it may have in flight (`client_concurrency` permits);
    /// dropped when nothing of the client is out, so no permit is held then.
    client_sends: FastMap<Arc<str>, Arc<Semaphore>>,
    /// Per batched client, its one batch in flight (one permit), dropped likewise.
    batch_sends: FastMap<Arc<str>, Arc<Semaphore>>,
    client_concurrency: usize,
    /// Per lane whose head is out, what withdraws that head before it is sent (its lane
    /// left this node, or the dispatcher stops).
    withdraw: FastMap<LaneKey, CancellationToken>,
    /// Cluster mode: the sensors served here. A sweep read before a partition moved away
    /// is not taken up after.
    serves: Option<Serves>,
    clock: Clock,
    /// Cluster mode: where rate slots are leased, and where the leases come back.
    grants: Option<(
        Arc<dyn crate::store::ClusterStore>,
        mpsc::UnboundedSender<Cmd>,
    )>,
    /// Where attempts are counted for the console's charts.
    recent: Option<Arc<crate::telemetry::recent::Recent>>,
    /// Cuts off the attempts still in flight when a stop's grace runs out.
    cut: CancellationToken,
}

/// How long a stop waits, past its grace, for the attempts it cut off to come back: they
/// end at once, so this only bounds a loop that lost one.
const CUT_WAIT: Duration = Duration::from_secs(2);

impl Core {
    fn new(
        settings: &Settings,
        recorder: mpsc::UnboundedSender<Outcome>,
        claims: mpsc::UnboundedSender<Admission>,
        shared: bool,
        cut: CancellationToken,
    ) -> Self {
        Self {
            lanes: Lanes::new(
                Arc::from(settings.node.as_str()),
                settings.policy.clone(),
                settings.concurrency,
                settings.client_concurrency,
                shared,
                settings.clock.clone(),
            ),
            recorder,
            claims,
            client_sends: FastMap::default(),
            batch_sends: FastMap::default(),
            client_concurrency: settings.client_concurrency as usize,
            withdraw: FastMap::default(),
            serves: settings.serves.clone(),
            clock: settings.clock.clone(),
            grants: None,
            recent: settings.recent.clone(),
            cut,
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Cmd>,
        stop: CancellationToken,
        grace: Duration,
    ) {
        loop {
            // Dispatch first, then wait: what was added before the loop (the pending
            // notifications loaded at start) may be due already, with nothing else coming
            // to wake the loop.
            self.lanes.fire_timers(self.clock.now());
            self.pump();
            families::NOTIFICATIONS_PENDING
                .gauge()
                .set(self.lanes.pending() as f64);
            let next = self.lanes.next_timer();
            let sleep = async {
                match next {
                    Some(due) => self.clock.sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            // Biased, so a simulated run picks the same branch every time; the timers are
            // fired at the top of every turn, so a busy channel does not starve them.
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                },
                _ = sleep => {}
            }
            // Take whatever else is queued before dispatching, so claims batch up.
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
        }
        // Shutdown: dispatch nothing new; heads claimed but not yet sent are given back;
        // attempts in flight finish within the grace and are recorded; those still out
        // then are cut off and recorded as failed attempts, so every lease this node holds
        // is given back before it exits and the node serving a lane next goes on at once.
        for (_, withdraw) in self.withdraw.drain() {
            withdraw.cancel();
        }
        let graced = tokio::time::Instant::now() + grace;
        if !self.drain(&mut rx, graced).await {
            tracing::warn!(
                inflight = self.lanes.inflight(),
                "Shutdown grace ran out with attempts in flight; cutting them off and giving their leases back."
            );
            self.cut.cancel();
            if !self
                .drain(&mut rx, tokio::time::Instant::now() + CUT_WAIT)
                .await
            {
                tracing::warn!(
                    inflight = self.lanes.inflight(),
                    "Attempts did not come back once cut off; their leases expire and they are sent again."
                );
            }
        }
    }

    /// Takes what comes of the attempts in flight until none is, or until `deadline`;
    /// whether none is.
    async fn drain(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Cmd>,
        deadline: tokio::time::Instant,
    ) -> bool {
        while self.lanes.inflight() > 0 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Cmd::Done(d))) => self.finish(*d, self.clock.now()),
                Ok(Some(Cmd::BatchDone(b))) => self.finish_batch(*b, self.clock.now()),
                // Durable; picked up at next start.
                Ok(Some(
                    Cmd::Deliver(_)
                    | Cmd::Sweep(_)
                    | Cmd::Resume(..)
                    | Cmd::Rate(..)
                    | Cmd::Batch(..)
                    | Cmd::Moved(_)
                    | Cmd::ClientGone(_)
                    | Cmd::Granted(..)
                    | Cmd::Recorded(_)
                    | Cmd::StillDisabled(_)
                    | Cmd::Describe(..),
                )) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.lanes.inflight() == 0
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Deliver(refs) => self.add(refs, self.clock.now()),
            Cmd::Sweep(mut refs) => {
                if let Some(Serves(serves)) = &self.serves {
                    refs.retain(|r| serves(r.sensor_id));
                }
                let outcomes = self.lanes.sweep(refs, self.clock.now());
                self.record(outcomes);
            }
            Cmd::Moved(Serves(moved)) => {
                let (out, given_back) = self.lanes.leave(|s| moved(s), self.clock.now());
                for lane in out {
                    if let Some(withdraw) = self.withdraw.remove(&lane) {
                        withdraw.cancel();
                    }
                }
                self.record(given_back);
            }
            Cmd::ClientGone(client) => {
                for (lane, withdraw) in &self.withdraw {
                    if lane.0 == client {
                        withdraw.cancel();
                    }
                }
            }
            Cmd::Done(d) => self.finish(*d, self.clock.now()),
            Cmd::BatchDone(b) => self.finish_batch(*b, self.clock.now()),
            Cmd::Batch(client, batch) => self.lanes.set_batch(&client, batch),
            Cmd::Resume(client, refs) => {
                let outcomes = self.lanes.resume(&client, refs, self.clock.now());
                self.record(outcomes);
            }
            Cmd::Rate(client, rate) => self.lanes.set_rate(&client, rate),
            Cmd::Granted(client, lease) => self.lanes.rate_granted(&client, lease),
            Cmd::Recorded(ids) => self.lanes.recorded(&ids),
            Cmd::StillDisabled(clients) => self.lanes.still_disabled(&clients, self.clock.now()),
            Cmd::Describe(client, tx) => {
                let _ = tx.send(self.lanes.describe(&client));
            }
        }
    }

    fn add(&mut self, refs: Vec<NotificationRef>, now: Millis) {
        let outcomes = self.lanes.add(refs, now);
        self.record(outcomes);
    }

    fn record(&self, outcomes: Vec<Outcome>) {
        for o in outcomes {
            let _ = self.recorder.send(o);
        }
    }

    /// Hands the heads the limits admit to the claimer, each with its client's permits.
    fn pump(&mut self) {
        for (lane, id) in self.lanes.admit(self.clock.now()) {
            let limit = self.client_concurrency;
            let client_sends = self
                .client_sends
                .entry(lane.0.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(limit)))
                .clone();
            let withdrawn = CancellationToken::new();
            self.withdraw.insert(lane.clone(), withdrawn.clone());
            let rate_limit = self.lanes.rate_limit(&lane.0);
            let _ = self.claims.send(Admission::One(Admitted {
                lane,
                id,
                client_sends,
                withdrawn,
                rate_limit,
            }));
        }
        for batch in self.lanes.admit_batches(self.clock.now()) {
            let Some(spec) = self.lanes.batch_of(&batch.client) else {
                continue;
            };
            let client_sends = self
                .batch_sends
                .entry(batch.client.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(1)))
                .clone();
            let withdrawn = batch
                .members
                .iter()
                .map(|(lane, _)| {
                    let w = CancellationToken::new();
                    self.withdraw.insert(lane.clone(), w.clone());
                    w
                })
                .collect();
            let rate_limit = self.lanes.rate_limit(&batch.client);
            let _ = self.claims.send(Admission::Batch(AdmittedBatch {
                batch,
                client_sends,
                withdrawn,
                spec,
                rate_limit,
            }));
        }
        self.lease_rates();
    }

    /// Asks the store for the rate slots the lanes want, each lease in a task of its own
    /// whose answer comes back as [`Cmd::Granted`].
    fn lease_rates(&mut self) {
        let Some((store, tx)) = &self.grants else {
            return;
        };
        for w in self.lanes.rates_wanted() {
            let (store, tx, clock) = (store.clone(), tx.clone(), self.clock.clone());
            tokio::spawn(async move {
                let lease = match store.grant_rate(&w.client, w.tokens, w.interval_us).await {
                    Ok((first_us, db_now_us)) => Some(rates::Lease {
                        first_us,
                        db_now_us,
                        received_us: clock.now().saturating_mul(1000),
                        tokens: w.tokens,
                    }),
                    Err(e) => {
                        tracing::warn!(client = %w.client, error = %e,
                            "Could not lease rate-limited requests; trying again in a second.");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        None
                    }
                };
                let _ = tx.send(Cmd::Granted(w.client, lease));
            });
        }
    }

    fn finish(&mut self, d: Done, now: Millis) {
        self.withdraw.remove(&d.lane);
        let client = d.lane.0.clone();
        if let Some(outcome) = self.lanes.finish(d, now, self.clock.random()) {
            self.outcome(outcome, now);
        }
        if !self.lanes.client_busy(&client) {
            self.client_sends.remove(&client);
        }
    }

    /// Counts an attempt's outcome in the recent rates and hands it to the recorder.
    fn outcome(&self, outcome: Outcome, now: Millis) {
        if let (Some(recent), Some(_)) = (&self.recent, &outcome.attempt) {
            let measure = match outcome.verdict {
                Verdict::Delivered => Measure::Delivered,
                _ => Measure::Failed,
            };
            recent.add(measure, 1, now);
        }
        let _ = self.recorder.send(outcome);
    }

    fn finish_batch(&mut self, b: BatchDone, now: Millis) {
        for d in &b.dones {
            self.withdraw.remove(&d.lane);
        }
        let jitter = self.clock.random();
        for outcome in self
            .lanes
            .finish_batch(&b.client, &b.id, b.dones, now, jitter)
        {
            self.outcome(outcome, now);
        }
        if !self.lanes.client_busy(&b.client) {
            self.client_sends.remove(&b.client);
            self.batch_sends.remove(&b.client);
        }
    }
}

#[cfg(test)]
mod tests;
