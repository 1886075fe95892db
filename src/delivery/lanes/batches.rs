//! Batches: a batched client's due heads gather into one request instead of one request
//! each ([`crate::domain::client::Batch`]).
//!
//! A batch holds at most one notification per lane — each lane's head, as a request of
//! its own would — so per-sensor order holds within and across batches. Heads gather
//! until `max_events` are there or the first has waited `max_wait_ms`; one batch of a
//! client is sending at a time, and one more may be claimed ahead of it, so the next is
//! ready the moment the first is answered.
//!
//! A batch that failed goes again as the same batch (the same id) with the same heads,
//! less those that ended meanwhile: its heads are due at one time, gather under its id,
//! and go once all of them are there (or after `max_wait_ms`). A request with a batch's id
//! never holds a head the previous request with that id did not: a head left out of a
//! request goes in a batch of its own afterwards, so a receiver that drops batch ids it
//! has seen never drops a notification it has not seen.

use crate::hashing::FastMap as HashMap;
use std::sync::Arc;

use super::{Done, Finished, LaneKey, Lanes, Token};
use crate::delivery::retry::RetryAt;
use crate::domain::client::Batch;
use crate::domain::{Millis, Outcome};

/// Batches of one client out at once: one sending and one claimed ahead of it.
pub(super) const BATCHES_OUT: u32 = 2;

/// A batch to claim and send.
#[derive(Debug)]
pub(in crate::delivery) struct BatchOut {
    pub client: Arc<str>,
    /// The batch id, the request's `webhook-id`.
    pub id: Arc<str>,
    /// Its heads: lane and notification id.
    pub members: Vec<(LaneKey, String)>,
    /// Notifications of an earlier request of this batch not in this one: their next
    /// request is another batch.
    pub left_out: Vec<String>,
}

/// What the lanes keep of batched clients.
#[derive(Default)]
pub(super) struct Batching {
    specs: HashMap<Arc<str>, Batch>,
    gathering: HashMap<Arc<str>, Gathering>,
    /// Heads of batches to send again (the last request of each failed), by batch id.
    again: HashMap<Arc<str>, Vec<(LaneKey, String)>>,
    /// Batches out (claimed or sending), per client.
    out: HashMap<Arc<str>, u32>,
}

/// One client's heads waiting to go.
#[derive(Default)]
struct Gathering {
    /// Heads of no batch yet, in the order they came due, and since when the first waits.
    fresh: Vec<LaneKey>,
    fresh_since: Millis,
    /// Heads of batches to send again, by batch id, and since when the first waits.
    again: HashMap<Arc<str>, (Millis, Vec<LaneKey>)>,
    /// Its rate limit allows no request before then.
    not_before: Millis,
    /// Waiting for a lease of its rate limit's slots.
    rate_wait: bool,
}

impl Gathering {
    fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.again.is_empty()
    }
}

impl Batching {
    /// Whether the client's heads go in batches.
    pub(super) fn batched(&self, client: &str) -> bool {
        self.specs.contains_key(client)
    }

    /// Whether a batch of the client is out.
    pub(super) fn busy(&self, client: &str) -> bool {
        self.out.contains_key(client)
    }

    /// The head of `lane`, notification `id`, goes in batch `batch` again.
    pub(super) fn join(&mut self, batch: Arc<str>, lane: LaneKey, id: String) {
        self.again.entry(batch).or_default().push((lane, id));
    }

    /// The head of `lane` is no longer one of batch `batch`'s (it ended, or was sent
    /// otherwise).
    pub(super) fn leave(&mut self, batch: &Arc<str>, lane: &LaneKey) {
        if let Some(members) = self.again.get_mut(batch) {
            members.retain(|(l, _)| l != lane);
            if members.is_empty() {
                self.again.remove(batch);
            }
        }
    }

    /// Forgets the gathering keys of lanes that no longer gather (they left this node).
    pub(super) fn forget_gone(&mut self, gathers: impl Fn(&LaneKey) -> bool) {
        self.gathering.retain(|_, g| {
            g.fresh.retain(&gathers);
            g.again.retain(|_, (_, keys)| {
                keys.retain(&gathers);
                !keys.is_empty()
            });
            !g.is_empty()
        });
    }

    /// Nothing gathers, nothing is out, no batch waits to go again.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.gathering.is_empty() && self.again.is_empty() && self.out.is_empty()
    }

    /// When a gathering batch is due to go, if any is waiting on time alone.
    pub(super) fn next_due(&self) -> Option<Millis> {
        self.gathering
            .iter()
            .filter(|(client, g)| {
                !g.is_empty()
                    && !g.rate_wait
                    && self.out.get(*client).copied().unwrap_or(0) < BATCHES_OUT
            })
            .filter_map(|(client, g)| {
                let wait = Millis::from(self.specs.get(client)?.max_wait_ms);
                let fresh = (!g.fresh.is_empty()).then_some(g.fresh_since + wait);
                let again = g.again.values().map(|(since, _)| since + wait).min();
                let due = match (fresh, again) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b)?,
                };
                Some(due.max(g.not_before))
            })
            .min()
    }
}

impl Lanes {
    /// Sets (or with `None` ends) a client's batching. Heads gathering when it ends go
    /// back to be sent one by one.
    pub(in crate::delivery) fn set_batch(&mut self, client: &str, batch: Option<Batch>) {
        match batch {
            Some(b) => {
                self.batching.specs.insert(Arc::from(client), b);
                // Heads waiting for a rate slot of their own gather now: the limit paces
                // the client's batches, and no single head takes a slot any more.
                if let Some(waiting) = self.rate_waiting.remove(client) {
                    for key in waiting {
                        Self::make_ready(&mut self.lanes, &mut self.ready, key);
                    }
                }
                self.rate_woken.remove(client);
            }
            None => {
                self.batching.specs.remove(client);
                self.batching
                    .again
                    .retain(|_, m| m.iter().all(|(l, _)| &*l.0 != client));
                if let Some(g) = self.batching.gathering.remove(client) {
                    let keys = g
                        .fresh
                        .into_iter()
                        .chain(g.again.into_values().flat_map(|(_, k)| k));
                    for key in keys {
                        let Some(lane) = self.lanes.get_mut(&key).filter(|l| l.gathered) else {
                            continue;
                        };
                        lane.gathered = false;
                        if let Some(head) = lane.queue.front_mut() {
                            head.batch = None;
                            self.ready.push_back(key);
                        }
                    }
                }
            }
        }
    }

    /// The client's batching, as admission applies it.
    pub(in crate::delivery) fn batch_of(&self, client: &str) -> Option<Batch> {
        self.batching.specs.get(client).copied()
    }

    /// A due head of a batched client joins what gathers for its next request: the batch
    /// it goes in again, or the next new one.
    pub(super) fn gather(&mut self, key: LaneKey, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&key).filter(|l| !l.gathered && !l.out) else {
            return;
        };
        let Some(head) = lane.queue.front_mut() else {
            return;
        };
        lane.gathered = true;
        // Its wait counts from when it came due.
        let since = head.due.min(now);
        let g = self.batching.gathering.entry(key.0.clone()).or_default();
        match head.batch.clone() {
            Some(b) if self.batching.again.contains_key(&b) => {
                g.again
                    .entry(b)
                    .or_insert_with(|| (since, Vec::new()))
                    .1
                    .push(key);
            }
            _ => {
                head.batch = None;
                if g.fresh.is_empty() {
                    g.fresh_since = since;
                }
                g.fresh.push(key);
            }
        }
    }

    /// The batches that go now: a batch to send again once all its heads are due (or it
    /// waited `max_wait_ms`), a new one once `max_events` heads gathered (or the first
    /// waited `max_wait_ms`), as long as fewer than [`BATCHES_OUT`] of the client are out,
    /// the dispatcher's limit admits one more request, and the client's rate limit a
    /// request now.
    pub(in crate::delivery) fn admit_batches(&mut self, now: Millis) -> Vec<BatchOut> {
        let mut out = Vec::new();
        let clients: Vec<Arc<str>> = self.batching.gathering.keys().cloned().collect();
        for client in clients {
            let Some(spec) = self.batching.specs.get(&client).copied() else {
                continue;
            };
            loop {
                let outstanding = self.batching.out.get(&client).copied().unwrap_or(0);
                if self.inflight >= self.admit || outstanding >= BATCHES_OUT {
                    break;
                }
                let Some(g) = self.batching.gathering.get_mut(&client) else {
                    break;
                };
                if g.rate_wait || g.not_before > now {
                    break;
                }
                let Some(pick) = pick(g, &self.batching.again, spec, now) else {
                    break;
                };
                match self.rates.take(&client, now) {
                    Token::Go => {}
                    Token::At(due) => {
                        g.not_before = due;
                        break;
                    }
                    Token::Lease => {
                        g.rate_wait = true;
                        break;
                    }
                }
                let batch = self.take(&client, pick, spec, now);
                if g_is_empty(&self.batching, &client) {
                    self.batching.gathering.remove(&client);
                }
                let Some(batch) = batch else {
                    continue;
                };
                *self.batching.out.entry(client.clone()).or_default() += 1;
                self.inflight += 1;
                out.push(batch);
            }
        }
        out
    }

    /// Takes the heads of `pick` out of the client's gathering, as a batch; `None` when
    /// none of them is a head any more.
    fn take(
        &mut self,
        client: &Arc<str>,
        pick: Pick,
        spec: Batch,
        now: Millis,
    ) -> Option<BatchOut> {
        let g = self.batching.gathering.get_mut(client)?;
        let again = matches!(pick, Pick::Again(_));
        let (id, keys, left_out) = match pick {
            Pick::Again(id) => {
                let (_, keys) = g.again.remove(&id)?;
                // Heads of the batch that are not due with the others go in a batch of
                // their own later, never under this id again.
                let members = self.batching.again.remove(&id).unwrap_or_default();
                let mut left_out = Vec::new();
                for (lane, nid) in members {
                    if keys.contains(&lane) {
                        continue;
                    }
                    // Perhaps no longer its lane's head: an older notification replayed
                    // meanwhile goes first, and this one after it, in a batch of its own.
                    if let Some(e) = self
                        .lanes
                        .get_mut(&lane)
                        .and_then(|l| l.queue.iter_mut().find(|e| e.id == nid))
                    {
                        e.batch = None;
                    }
                    left_out.push(nid);
                }
                (id, keys, left_out)
            }
            Pick::Fresh => {
                let n = g.fresh.len().min(spec.max_events as usize);
                let keys: Vec<LaneKey> = g.fresh.drain(..n).collect();
                g.fresh_since = now;
                let id: Arc<str> = Arc::from(self.ids.ulid().to_string());
                (id, keys, Vec::new())
            }
        };
        let mut members = Vec::with_capacity(keys.len());
        let mut strays = Vec::new();
        for key in keys {
            // Only a lane still gathering goes: one that left this node since (and maybe
            // came back, waiting on a timer or gathering anew) or was taken already is not
            // this key's any more.
            let Some(lane) = self.lanes.get_mut(&key).filter(|l| l.gathered) else {
                continue;
            };
            let Some(head) = lane.queue.front() else {
                continue;
            };
            lane.gathered = false;
            // Only a head of the batch goes under its id again; any other gathers anew.
            if again && head.batch.as_deref() != Some(&*id) {
                strays.push(key);
                continue;
            }
            lane.out = true;
            members.push((key, head.id.clone()));
        }
        for key in strays {
            self.gather(key, now);
        }
        (!members.is_empty()).then(|| BatchOut {
            client: client.clone(),
            id,
            members,
            left_out,
        })
    }

    /// A lease of a client's rate slots came (or asking failed): its batches may go.
    pub(super) fn batch_rate_granted(&mut self, client: &str) {
        if let Some(g) = self.batching.gathering.get_mut(client) {
            g.rate_wait = false;
        }
    }

    /// Takes what came of a batch: each of its heads as [`Lanes::finish`] takes one, a
    /// failed batch's heads due again together (at the time its most tried head's retry
    /// policy gives) in the same batch. Returns the outcomes to record.
    pub(in crate::delivery) fn finish_batch(
        &mut self,
        client: &Arc<str>,
        id: &Arc<str>,
        dones: Vec<Done>,
        now: Millis,
        jitter: f64,
    ) -> Vec<Outcome> {
        self.inflight -= 1;
        if let Some(n) = self.batching.out.get_mut(client) {
            *n -= 1;
            if *n == 0 {
                self.batching.out.remove(client);
            }
        }
        // One retry time for the whole batch.
        let mut tried = 0;
        let mut answer = None;
        for d in &dones {
            if let Finished::Attempted(result) = &d.result {
                let head = self.lanes.get(&d.lane).and_then(|l| l.queue.front());
                if let Some(h) = head.filter(|h| h.id == d.id) {
                    tried = tried.max(h.attempts + 1);
                }
                answer.get_or_insert(result);
            }
        }
        if let Some(result) = answer {
            self.answered(client, result);
        }
        // Only heads that were attempted are retried, so with none the time is unused.
        let retry_at = answer.map_or(now, |result| {
            self.policy.retry_time(tried.max(1), result, jitter, now)
        });
        let mut outcomes = Vec::new();
        for d in dones {
            let sent = matches!(d.result, Finished::Attempted(_));
            let batch = sent.then_some(id);
            outcomes.extend(self.settle(d, now, RetryAt::At(retry_at), batch));
        }
        outcomes
    }
}

/// What goes next of a client's gathering.
enum Pick {
    Again(Arc<str>),
    Fresh,
}

/// A batch to send again whose heads are all due, or whose first waited long enough;
/// else a new batch, if full or its first waited long enough.
fn pick(
    g: &Gathering,
    again: &HashMap<Arc<str>, Vec<(LaneKey, String)>>,
    spec: Batch,
    now: Millis,
) -> Option<Pick> {
    let wait = Millis::from(spec.max_wait_ms);
    for (id, (since, keys)) in &g.again {
        let members = again.get(id).map_or(0, Vec::len);
        if keys.len() >= members || now >= since + wait {
            return Some(Pick::Again(id.clone()));
        }
    }
    let full = g.fresh.len() >= spec.max_events as usize;
    (!g.fresh.is_empty() && (full || now >= g.fresh_since + wait)).then_some(Pick::Fresh)
}

fn g_is_empty(b: &Batching, client: &Arc<str>) -> bool {
    b.gathering.get(client).is_some_and(Gathering::is_empty)
}
