//! The dispatcher's loop ([`Core`]): it feeds the lanes what arrives and the time, and
//! carries out what they answer — admitted heads to the claimer, outcomes to the recorder,
//! rate leases asked of a shared store — and at a stop drains what is in flight.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::claimer::{Admission, Admitted, AdmittedBatch};
use super::client_slots::ClientSlots;
use super::lanes::{Done, LaneKey, Lanes};
use super::{FastMap, Serves, Settings, rates};
use crate::clock::Clock;
use crate::domain::{Millis, NotificationRef, Outcome, Verdict};
use crate::telemetry::families;
use crate::telemetry::recent::Measure;

pub(super) enum Cmd {
    Deliver(Vec<NotificationRef>),
    /// Made by a round that decides for the whole cluster ([`Dispatcher::deliver_served`]).
    DeliverServed(Vec<NotificationRef>),
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
pub(super) struct BatchDone {
    pub(super) client: Arc<str>,
    pub(super) id: Arc<str>,
    pub(super) dones: Vec<Done>,
}

/// The dispatcher's loop: feeds the lanes what arrives and the time, and carries out what
/// they answer (admitted heads to the [`claimer`], outcomes to the [`recorder`]).
pub(super) struct Core {
    pub(super) lanes: Lanes,
    recorder: mpsc::UnboundedSender<Outcome>,
    /// Heads and batches admitted by the limits, on their way to the [`claimer`].
    claims: mpsc::UnboundedSender<Admission>,
    /// Per client, the requests it may have in flight (`client_concurrency` permits);
    /// dropped when nothing of the client is out, so no permit is held then.
    pub(super) client_sends: FastMap<Arc<str>, Arc<ClientSlots>>,
    /// Per batched client, its one batch in flight (one permit), dropped likewise.
    batch_sends: FastMap<Arc<str>, Arc<Semaphore>>,
    client_concurrency: usize,
    /// Per lane whose head is out, what withdraws that head before it is sent (its lane
    /// left this node, or the dispatcher stops).
    withdraw: FastMap<LaneKey, CancellationToken>,
    /// Cluster mode: the sensors served here. A sweep read before a partition moved away
    /// is not taken up after.
    serves: Option<Serves>,
    pub(super) clock: Clock,
    /// Cluster mode: where rate slots are leased, and where the leases come back.
    pub(super) grants: Option<(
        Arc<dyn crate::store::ClusterStore>,
        mpsc::UnboundedSender<Cmd>,
    )>,
    /// Where attempts are counted for the console's charts.
    recent: Option<Arc<crate::telemetry::recent::Recent>>,
    /// Cuts off the attempts still in flight when a stop's grace runs out.
    cut: CancellationToken,
    /// `latch_notifications_pending`, set at every turn of the loop: the handle is taken
    /// once, not looked up in the recorder each turn.
    pending_gauge: metrics::Gauge,
}

/// How long a stop waits, past its grace, for the attempts it cut off to come back: they
/// end at once, so this only bounds a loop that lost one.
const CUT_WAIT: Duration = Duration::from_secs(2);

impl Core {
    pub(super) fn new(
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
            pending_gauge: families::NOTIFICATIONS_PENDING.gauge(),
        }
    }

    pub(super) async fn run(
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
            self.pending_gauge.set(self.lanes.pending() as f64);
            super::progress::pending(self.lanes.pending());
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
                    | Cmd::DeliverServed(_)
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

    pub(super) fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Deliver(refs) => self.add(refs, self.clock.now()),
            Cmd::DeliverServed(mut refs) => {
                self.keep_served(&mut refs);
                self.add(refs, self.clock.now());
            }
            Cmd::Sweep(mut refs) => {
                self.keep_served(&mut refs);
                let outcomes = self.lanes.sweep(refs, self.clock.now());
                self.record(outcomes);
                self.withdraw_pointless();
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
                self.withdraw_pointless();
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

    /// In cluster mode, drops the notifications of sensors another node serves.
    fn keep_served(&self, refs: &mut Vec<NotificationRef>) {
        if let Some(Serves(serves)) = &self.serves {
            refs.retain(|r| serves(r.sensor_id));
        }
    }

    pub(super) fn add(&mut self, refs: Vec<NotificationRef>, now: Millis) {
        let outcomes = self.lanes.add(refs, now);
        self.record(outcomes);
        self.withdraw_pointless();
    }

    /// Withdraws the heads out here that a newer state just made pointless: one not sent
    /// yet comes back unsent, to be superseded; one on its way is answered as any other.
    /// Called after every call that queues notifications, so each lane named still has the
    /// head it was named for out.
    fn withdraw_pointless(&mut self) {
        for lane in self.lanes.withdrawals() {
            if let Some(withdraw) = self.withdraw.get(&lane) {
                withdraw.cancel();
            }
        }
    }

    fn record(&self, outcomes: Vec<Outcome>) {
        for o in outcomes {
            let _ = self.recorder.send(o);
        }
    }

    /// `client`'s request slots, made as its last attempt here left it (answered or not).
    fn client_slots(&mut self, client: &Arc<str>) -> Arc<ClientSlots> {
        let share = self.client_concurrency;
        let unanswered = self.lanes.unanswered(client);
        self.client_sends
            .entry(client.clone())
            .or_insert_with(|| Arc::new(ClientSlots::new(share, unanswered)))
            .clone()
    }

    /// Hands the heads the limits admit to the claimer, each with its client's permits.
    pub(super) fn pump(&mut self) {
        for (lane, id) in self.lanes.admit(self.clock.now()) {
            let client_sends = self.client_slots(&lane.0);
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
            let slots = self.client_slots(&batch.client);
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
                slots,
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

    pub(super) fn finish(&mut self, d: Done, now: Millis) {
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
