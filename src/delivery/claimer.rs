//! The claimer: leases admitted heads from the store in batches and starts an attempt for
//! each one leased to us. The claim reads URL and secret from the registry *now*, and
//! cancels those whose client is gone or no longer owns the sensor.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::attempt::{AttemptResult, Failure};
use super::client_slots::ClientSlots;
use super::lanes::{BatchOut, Done, Finished, LaneKey};
use super::transport::Transport;
use super::{BatchDone, Cmd, Settings};
use crate::domain::client::Batch;
use crate::domain::{Claim, ClaimBatch, Millis, Sendable};
use crate::hashing::FastSet;
use crate::store::Outbox;

/// Most heads claimed in one store call.
const CLAIM_BATCH_MAX: usize = 1024;
/// Claims running at once on a shared (server) store. Each claim takes whatever piled up
/// while the others ran, so fewer in flight means fewer, larger claims: at 4, a one-client
/// burst on PostgreSQL ran ~1,300 claims of ~15 heads for 20,000 notifications; at 2, ~470
/// of ~40, with less of PostgreSQL's time in claims and more deliveries a second (1 was no
/// better than 2). Two, so one claim slow to come back does not stall the dispatcher.
const CLAIMS_IN_FLIGHT: usize = 2;

/// A head admitted by the limits, on its way to be claimed and sent.
pub(super) struct Admitted {
    pub lane: LaneKey,
    pub id: String,
    /// Requests in flight to its client.
    pub client_sends: Arc<ClientSlots>,
    /// Cancelled when it is not to be sent any more (its lane left this node, or the
    /// dispatcher stops): given back unsent if it was claimed.
    pub withdrawn: CancellationToken,
    /// The client's `rate_limit` as admission applied it (`None`: none known).
    pub rate_limit: Option<u32>,
}

/// A batch admitted by the limits: its heads claimed in one call, sent in one request.
pub(super) struct AdmittedBatch {
    pub batch: BatchOut,
    /// The client's one request slot for batches.
    pub client_sends: Arc<Semaphore>,
    /// The client's request slots, which its single heads take too: one at a time
    /// beside them once its endpoint does not answer.
    pub slots: Arc<ClientSlots>,
    /// Per head, as [`Admitted::withdrawn`].
    pub withdrawn: Vec<CancellationToken>,
    /// The client's batching and `rate_limit` as admission applied them.
    pub spec: Batch,
    pub rate_limit: Option<u32>,
}

/// What admission hands the claimer.
pub(super) enum Admission {
    One(Admitted),
    Batch(AdmittedBatch),
}

/// What sending a claimed head needs.
#[derive(Clone)]
pub(super) struct Sending {
    /// Where attempts go out.
    pub transport: Arc<dyn Transport>,
    pub settings: Arc<Settings>,
    /// Requests in flight in all (`concurrency` permits).
    pub sends: Arc<Semaphore>,
    pub tx: mpsc::UnboundedSender<Cmd>,
    pub tracker: TaskTracker,
    /// Cancelled when a stop's grace has run out: attempts still in flight are cut off,
    /// each a failed attempt, so their leases are given back before latch exits.
    pub cut: CancellationToken,
    /// Asks the sweeper (on a shared store) to look for what came since its last sweep
    /// now: a claim found a lane waiting on an older notification no node holds.
    pub sweep_soon: Arc<tokio::sync::Notify>,
}

impl Sending {
    /// A head told to wait behind an older notification no node holds would wait for
    /// the next sweep to bring it, up to two seconds (simulation seed 1001140: a site
    /// round's `connection_lost` made on another node held a healthy client's next
    /// notification 3 s): the sweeper looks now.
    fn unswept(&self, claims: &[Claim]) {
        if claims
            .iter()
            .any(|c| matches!(c, Claim::Later { unswept: true, .. }))
        {
            self.sweep_soon.notify_one();
        }
    }
}

/// What an attempt cut off by a stop came to: a failed attempt without an answer, retried
/// like any other (the same notification, the same `webhook-id`).
pub(super) const CUT_OFF: &str = "cut off: latch stopped before an answer came";

/// Runs `attempt`, begun at `at`, unless the stop's grace runs out first: then it is cut
/// off.
async fn unless_cut(
    sending: &Sending,
    at: Millis,
    attempt: impl std::future::Future<Output = AttemptResult>,
) -> AttemptResult {
    tokio::select! {
        biased;
        result = attempt => result,
        _ = sending.cut.cancelled() => AttemptResult::failed(
            at,
            Failure::CutOff,
            CUT_OFF.into(),
            std::time::Duration::from_millis((sending.settings.clock.now() - at).max(0) as u64),
        ),
    }
}

/// Claims due heads in batches: whatever piled up while the previous claim ran is claimed
/// in one store call, so claims cost one transaction per batch under load, and spawns each
/// attempt.
pub(super) async fn claimer(
    store: Arc<dyn Outbox>,
    sending: Sending,
    mut rx: mpsc::UnboundedReceiver<Admission>,
) {
    // A server database takes several claims at once (each its own transaction and
    // connection); the embedded one has a single writer, so one at a time is as fast.
    let parallel = if sending.settings.shared {
        CLAIMS_IN_FLIGHT
    } else {
        1
    };
    let permits = Arc::new(Semaphore::new(parallel));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (mut heads, mut batches) = (Vec::new(), Vec::new());
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Admission::One(a) => heads.push(a),
                Admission::Batch(b) => batches.push(b),
            }
            next = (heads.len() + batches.len() < CLAIM_BATCH_MAX)
                .then(|| rx.try_recv().ok())
                .flatten();
        }
        let (store, sending) = (store.clone(), sending.clone());
        sending.tracker.clone().spawn(async move {
            if !heads.is_empty() {
                claim_and_send(store.clone(), sending.clone(), heads).await;
            }
            for b in batches {
                claim_and_send_batch(store.clone(), sending.clone(), b).await;
            }
            drop(permit);
        });
    }
}

/// Claims one batch of heads and starts an attempt for each one leased to us; an attempt
/// waits for a request slot of its client and of the whole dispatcher. A head withdrawn
/// before it is sent is not claimed, or is given back.
#[tracing::instrument(name = "claim", skip_all, fields(notifications = batch.len()))]
async fn claim_and_send(store: Arc<dyn Outbox>, sending: Sending, batch: Vec<Admitted>) {
    let now = sending.settings.clock.now();
    let tx = &sending.tx;
    let done = |lane, id, result| {
        let _ = tx.send(Cmd::Done(Box::new(Done { lane, id, result })));
    };
    let (batch, withdrawn): (Vec<Admitted>, Vec<Admitted>) =
        batch.into_iter().partition(|a| !a.withdrawn.is_cancelled());
    for a in withdrawn {
        done(a.lane, a.id, Finished::Later(now));
    }
    if batch.is_empty() {
        return;
    }
    let lease_until = now + sending.settings.lease();
    let ids: Vec<String> = batch.iter().map(|a| a.id.clone()).collect();
    let claims = store
        .claim(ids, sending.settings.node.clone(), now, lease_until, None)
        .await;
    let claims = match claims {
        Ok(c) => {
            sending.unswept(&c);
            c
        }
        Err(e) => {
            tracing::warn!(error = %e, "Claiming notifications failed; trying again shortly.");
            for Admitted { lane, id, .. } in batch {
                done(lane, id, Finished::Held(now + 1000));
            }
            return;
        }
    };
    // Every head of a client read the same registry row in this claim: the dispatcher is
    // told its rate limit once, not once a head (a message and a handling a webhook).
    let mut rates_told: FastSet<Arc<str>> = FastSet::default();
    for (admitted, claim) in batch.into_iter().zip(claims) {
        let Admitted {
            lane,
            id,
            client_sends,
            withdrawn,
            rate_limit,
        } = admitted;
        let result = match claim {
            // A rate limit set (or changed) through another node, which admission did not
            // know: the head goes back to its lane and through the limit, rather than out
            // with every head admitted meanwhile. Its lease goes back at once: a lane that
            // leaves this node before it is claimed again must not hold the next owner up.
            Claim::Send(s) if s.rate_limit.is_some() && s.rate_limit != rate_limit => {
                let _ = tx.send(Cmd::Rate(lane.0.clone(), s.rate_limit));
                released(&s)
            }
            // Batching set through another node: back through admission, into a batch.
            Claim::Send(s) if s.batch.is_some() => {
                let _ = tx.send(Cmd::Batch(lane.0.clone(), s.batch));
                released(&s)
            }
            Claim::Send(s) => {
                // The registry as the claim read it: a rate limit lifted on another node.
                if rates_told.insert(lane.0.clone()) {
                    let _ = tx.send(Cmd::Rate(lane.0.clone(), s.rate_limit));
                }
                let sending = sending.clone();
                sending.tracker.clone().spawn(async move {
                    let result = {
                        // The client's slot first: a global one is held only while sending.
                        let slots = async {
                            let client = client_sends.acquire().await?;
                            let all = sending.sends.acquire().await.ok()?;
                            Some((client, all))
                        };
                        let slots = tokio::select! {
                            biased;
                            _ = withdrawn.cancelled() => None,
                            slots = slots => Some(slots),
                        };
                        let Some(slots) = slots.filter(|_| !withdrawn.is_cancelled()) else {
                            // Not ours to send any more: the lease goes back at once, so
                            // the node serving its lane now need not wait for it.
                            let result = Finished::Released {
                                attempts: s.notification.attempts,
                            };
                            let _ = sending
                                .tx
                                .send(Cmd::Done(Box::new(Done { lane, id, result })));
                            return;
                        };
                        let Some(_slots) = slots else {
                            return;
                        };
                        // Waited for a slot behind heads claimed ahead until the lease could
                        // run out mid-attempt (a slow endpoint): claim it again instead, so
                        // no other node may take it while it is being sent.
                        let now = sending.settings.clock.now();
                        if now + sending.settings.attempt_span() > lease_until {
                            let result = released(&s);
                            let _ = sending
                                .tx
                                .send(Cmd::Done(Box::new(Done { lane, id, result })));
                            return;
                        }
                        let at = sending.settings.clock.now();
                        let attempt = sending.transport.send(&s, sending.settings.timeout, at);
                        let result = unless_cut(&sending, at, attempt).await;
                        client_sends.answered(result.unanswered());
                        result
                    };
                    let result = Finished::Attempted(result);
                    let _ = sending
                        .tx
                        .send(Cmd::Done(Box::new(Done { lane, id, result })));
                });
                continue;
            }
            other => unsent(other),
        };
        done(lane, id, result);
    }
}

/// What a claim that leased nothing to us means for the head.
fn unsent(claim: Claim) -> Finished {
    match claim {
        Claim::Done { status, .. } => Finished::Gone(status),
        Claim::Leased { until, .. } => Finished::Held(until),
        Claim::Later { at, .. } => Finished::Later(at),
        Claim::Disabled { .. } => Finished::Parked,
        // Leased to us but not to be sent now.
        Claim::Send(s) => released(&s),
    }
}

/// A head leased to us and not sent: its lease is given back at once (recorded with its
/// attempts as they were), and it is claimed again from its lane. Kept, the lease would
/// hold up another node should the lane move there before this node claims it again.
fn released(s: &Sendable) -> Finished {
    Finished::Released {
        attempts: s.notification.attempts,
    }
}

/// Claims one batch's heads in one store call and sends those leased to us in one request,
/// once the client's batch slot and a request slot of the dispatcher are free. Every head
/// comes back to the dispatcher in one [`BatchDone`], so the client's next batch may go.
#[tracing::instrument(name = "claim", skip_all, fields(batch_id = %a.batch.id, notifications = a.batch.members.len()))]
async fn claim_and_send_batch(store: Arc<dyn Outbox>, sending: Sending, a: AdmittedBatch) {
    let settings = &sending.settings;
    let now = settings.clock.now();
    let AdmittedBatch {
        batch:
            BatchOut {
                client,
                id,
                members,
                left_out,
            },
        client_sends,
        slots,
        withdrawn,
        spec,
        rate_limit,
    } = a;
    let report = |dones: Vec<Done>| {
        let done = BatchDone {
            client: client.clone(),
            id: id.clone(),
            dones,
        };
        let _ = sending.tx.send(Cmd::BatchDone(Box::new(done)));
    };
    let mut dones = Vec::new();
    let mut live = Vec::new();
    for ((lane, nid), w) in members.into_iter().zip(withdrawn) {
        if w.is_cancelled() {
            dones.push(Done {
                lane,
                id: nid,
                result: Finished::Later(now),
            });
        } else {
            live.push((lane, nid, w));
        }
    }
    if live.is_empty() {
        return report(dones);
    }
    let lease_until = now + settings.lease();
    let ids = live.iter().map(|(_, nid, _)| nid.clone()).collect();
    let batch = Some(ClaimBatch { left_out });
    let claims = match store
        .claim(ids, settings.node.clone(), now, lease_until, batch)
        .await
    {
        Ok(c) => {
            sending.unswept(&c);
            c
        }
        Err(e) => {
            tracing::warn!(error = %e, "Claiming a batch failed; trying again shortly.");
            for (lane, id, _) in live {
                let result = Finished::Held(now + 1000);
                dones.push(Done { lane, id, result });
            }
            return report(dones);
        }
    };
    // The registry as the claim read it: batching or a rate limit changed through another
    // node sends the heads back through admission, still leased here.
    let changed = claims.iter().find_map(|c| match c {
        Claim::Send(s) => Some((s.batch, s.rate_limit)),
        _ => None,
    });
    if let Some((batch, rate)) = changed {
        let _ = sending.tx.send(Cmd::Rate(client.clone(), rate));
        if batch != Some(spec) {
            let _ = sending.tx.send(Cmd::Batch(client.clone(), batch));
        }
    }
    let back = changed
        .is_some_and(|(batch, rate)| batch != Some(spec) || (rate.is_some() && rate != rate_limit));
    let mut sends: Vec<Box<Sendable>> = Vec::new();
    let mut sent = Vec::new();
    for ((lane, nid, w), claim) in live.into_iter().zip(claims) {
        match claim {
            Claim::Send(s) if !back => {
                sends.push(s);
                sent.push((lane, nid, w));
            }
            Claim::Send(s) => dones.push(Done {
                lane,
                id: nid,
                result: released(&s),
            }),
            other => dones.push(Done {
                lane,
                id: nid,
                result: unsent(other),
            }),
        }
    }
    if sends.is_empty() {
        return report(dones);
    }
    // The request goes in a task of its own, as a single head's does: the claim task is
    // the claims of every client, and a batch waiting for its client's slot, or for an
    // endpoint that never answers, must not hold it (clients are isolated).
    let sending = sending.clone();
    sending.tracker.clone().spawn(async move {
        let claimed = sends.into_iter().zip(sent).collect();
        let client_slots = (client_sends, slots);
        let dones =
            send_claimed_batch(&sending, &id, client_slots, claimed, lease_until, dones).await;
        let done = BatchDone { client, id, dones };
        let _ = sending.tx.send(Cmd::BatchDone(Box::new(done)));
    });
}

/// Sends a batch's claimed heads in one request once the client's batch slot and a request
/// slot of the dispatcher are free, and adds what came of each head to `dones`.
async fn send_claimed_batch(
    sending: &Sending,
    id: &Arc<str>,
    (client_sends, slots): (Arc<Semaphore>, Arc<ClientSlots>),
    claimed: Vec<(Box<Sendable>, (LaneKey, String, CancellationToken))>,
    lease_until: Millis,
    mut dones: Vec<Done>,
) -> Vec<Done> {
    let settings = &sending.settings;
    let _client = client_sends.acquire().await;
    let _slot = slots.acquire().await;
    let _all = sending.sends.acquire().await;
    // Heads withdrawn while the batch waited for its slot (their lane left this node, or
    // the dispatcher stops) are given back unsent; the rest go.
    let (mut go_sends, mut go) = (Vec::new(), Vec::new());
    for (s, (lane, nid, w)) in claimed {
        if w.is_cancelled() {
            let result = Finished::Released {
                attempts: s.notification.attempts,
            };
            dones.push(Done {
                lane,
                id: nid,
                result,
            });
        } else {
            go_sends.push(s);
            go.push((lane, nid));
        }
    }
    let now = settings.clock.now();
    if go.is_empty() || now + settings.attempt_span() > lease_until {
        // Nothing left to send, or the lease could run out mid-request: claimed again.
        for ((lane, id), s) in go.into_iter().zip(&go_sends) {
            let result = released(s);
            dones.push(Done { lane, id, result });
        }
        return dones;
    }
    let attempt = sending
        .transport
        .send_batch(id, &go_sends, settings.timeout, now);
    let result = unless_cut(sending, now, attempt).await;
    slots.answered(result.unanswered());
    for (lane, nid) in go {
        let result = Finished::Attempted(result.clone());
        dones.push(Done {
            lane,
            id: nid,
            result,
        });
    }
    dones
}
