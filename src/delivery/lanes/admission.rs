//! Admission: timers that make heads due, and the limits a due head passes before it is
//! claimed — the node's, its client's concurrency (one while its endpoint does not
//! answer), and its client's rate of requests.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::sync::Arc;

use super::{Lane, LaneKey, Lanes, TIMER_SLACK};
use crate::delivery::rates::{Lease, Rates, Token, Wanted};
use crate::delivery::{FastMap, FastSet};
use crate::domain::Millis;

impl Lanes {
    /// How many heads of `client` may be out at once.
    pub(super) fn client_limit(&self, client: &str) -> u32 {
        limit_of(&self.unanswered, self.admit_client, client)
    }

    /// Heads that waited for their client's slots go to admission again while the client
    /// has fewer out than it may. A finished head hands its slot to the next waiting one
    /// ([`Lanes::finish`]), but a head that then does not take it (it gathers for a batch,
    /// its lane left this node) would leave the others waiting with no slot out to free
    /// one, and a client's limit can grow (its endpoint answers again): so a client
    /// below its limit never keeps heads waiting.
    pub(super) fn refill(&mut self) {
        if self.client_waiting.is_empty() {
            return;
        }
        let mut go = Vec::new();
        for (client, waiting) in &mut self.client_waiting {
            let out = self.client_inflight.get(client).copied().unwrap_or(0);
            // A batched client's heads take no slot of their own: they gather.
            let limit = match self.batching.batched(client) {
                true => u32::MAX,
                false => limit_of(&self.unanswered, self.admit_client, client),
            };
            for _ in out..limit {
                match waiting.pop_front() {
                    Some(k) => go.push(k),
                    None => break,
                }
            }
        }
        self.client_waiting.retain(|_, q| !q.is_empty());
        self.ready.extend(go);
    }

    /// Clients' rates are the cluster's: their slots come leased from the store
    /// ([`Lanes::rates_wanted`], [`Lanes::rate_granted`]).
    pub(in crate::delivery) fn share_rates(&mut self) {
        self.rates = Rates::new(true);
    }

    /// Sets (or with `None` lifts) a client's limit of requests per second.
    pub(in crate::delivery) fn set_rate(&mut self, client: &str, per_second: Option<u32>) {
        self.rates.set(client, per_second);
        if per_second.is_none() {
            self.rate_granted(client, None);
        }
    }

    /// The `rate_limit` admission applies to `client` now.
    pub(in crate::delivery) fn rate_limit(&self, client: &str) -> Option<u32> {
        self.rates.limit(client)
    }

    /// The leases of rate slots to ask the store for.
    pub(in crate::delivery) fn rates_wanted(&mut self) -> Vec<Wanted> {
        self.rates.wanted()
    }

    /// A lease of `client`'s rate slots came (`None`: asking failed): the heads that waited
    /// for it are ready again.
    pub(in crate::delivery) fn rate_granted(&mut self, client: &str, lease: Option<Lease>) {
        self.rates.granted(client, lease);
        if let Some(waiting) = self.rate_waiting.remove(client) {
            for key in waiting {
                Self::make_ready(&mut self.lanes, &mut self.ready, key);
            }
        }
        self.rate_woken.remove(client);
        self.batch_rate_granted(client);
    }

    pub(super) fn schedule(&mut self, key: LaneKey, due: Millis, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&key) else {
            return;
        };
        if due <= now {
            lane.busy = true;
            lane.timer = None;
            self.ready.push_back(key);
        } else if lane.timer != Some(due) {
            lane.timer = Some(due);
            self.timers.push(Reverse((due, key)));
            self.compact_timers();
        }
    }

    /// Drops stale timers once they outnumber the lanes. A stale one is skipped when it
    /// comes due, but that can be an hour out (a retry's delay, then a newer state
    /// superseded the retry): a sensor flapping for a dead client would leave one per
    /// change. Each lane has at most one live timer, so a compaction leaves at most one
    /// per lane, and the next one is at least as many pushes away: O(1) a push.
    pub(super) fn compact_timers(&mut self) {
        if self.timers.len() <= 2 * self.lanes.len() + TIMER_SLACK {
            return;
        }
        let lanes = &self.lanes;
        self.timers
            .retain(|Reverse((due, key))| lanes.get(key).is_some_and(|l| l.timer == Some(*due)));
        self.timers.shrink_to(2 * self.timers.len() + TIMER_SLACK);
    }

    /// Moves the heads due by `now` to the ready queue, and the first head waiting for a
    /// client's rate slot once that slot has come.
    pub(in crate::delivery) fn fire_timers(&mut self, now: Millis) {
        while let Some(Reverse((due, _))) = self.rate_wakes.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, client))) = self.rate_wakes.pop() else {
                break;
            };
            if self.rate_woken.get(&client) != Some(&due) {
                continue;
            }
            self.rate_woken.remove(&client);
            self.next_rate_waiting(&client);
        }
        while let Some(Reverse((due, _))) = self.timers.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, key))) = self.timers.pop() else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            // Stale timers (the lane moved on since) are skipped.
            if lane.timer != Some(due) {
                continue;
            }
            lane.timer = None;
            if lane.busy {
                continue;
            }
            match lane.queue.front().map(|h| h.due) {
                None => {}
                Some(head_due) if head_due > now => {
                    lane.timer = Some(head_due);
                    self.timers.push(Reverse((head_due, key)));
                }
                Some(_) => {
                    lane.busy = true;
                    self.ready.push_back(key);
                }
            }
        }
    }

    /// Moves the first head waiting for `client`'s rate (if any) to the ready queue.
    pub(super) fn next_rate_waiting(&mut self, client: &Arc<str>) {
        let Some(waiting) = self.rate_waiting.get_mut(client) else {
            return;
        };
        while let Some(key) = waiting.pop_front() {
            if Self::make_ready(&mut self.lanes, &mut self.ready, key) {
                break;
            }
        }
        if waiting.is_empty() {
            self.rate_waiting.remove(client);
        }
    }

    /// Readies a lane that waited for its client's rate, unless the wait went stale: the
    /// lane is gone, empty, or ready or out by another way meanwhile (a newer notification
    /// scheduled it), which must not send its head twice.
    pub(super) fn make_ready(
        lanes: &mut FastMap<LaneKey, Lane>,
        ready: &mut VecDeque<LaneKey>,
        key: LaneKey,
    ) -> bool {
        let Some(lane) = lanes.get_mut(&key) else {
            return false;
        };
        if lane.busy || lane.queue.is_empty() {
            return false;
        }
        lane.busy = true;
        lane.timer = None;
        ready.push_back(key);
        true
    }

    /// The ready heads the limits admit at `now`, each with its lane: to be claimed and
    /// sent. A head whose client is at its concurrency limit waits for one of that
    /// client's to finish; one whose client's rate limit has no token yet waits on a timer
    /// for the next token.
    pub(in crate::delivery) fn admit(&mut self, now: Millis) -> Vec<(LaneKey, String)> {
        self.refill();
        let mut batch = Vec::new();
        while self.inflight < self.admit {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            if lane.ended_unwritten > 0 {
                // Older ones that left the lane are not written yet: it goes once they are.
                lane.held_back = true;
                continue;
            }
            let Some(head) = lane.queue.front() else {
                continue;
            };
            if let Some(u) = self.unwritten.get_mut(&head.id) {
                // Its last outcome is not written yet: it goes once it is.
                u.waits = true;
                continue;
            }
            if self.batching.batched(&key.0) {
                // Gathers for the client's next request ([`Lanes::admit_batches`]).
                self.gather(key, now);
                continue;
            }
            let id = head.id.clone();
            let count = self.client_inflight.get(&key.0).copied().unwrap_or(0);
            if count >= self.client_limit(&key.0) {
                self.client_waiting
                    .entry(key.0.clone())
                    .or_default()
                    .push_back(key);
                continue;
            }
            match self.rates.take(&key.0, now) {
                Token::Go => {}
                // No slot yet: the head queues for one; the client wakes when the next
                // comes.
                Token::At(due) => {
                    // Not ready while it waits: a newer state may still supersede it.
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.busy = false;
                    }
                    let client = key.0.clone();
                    self.rate_waiting
                        .entry(client.clone())
                        .or_default()
                        .push_back(key);
                    if self.rate_woken.get(&client) != Some(&due) {
                        self.rate_woken.insert(client.clone(), due);
                        self.rate_wakes.push(Reverse((due, client)));
                    }
                    continue;
                }
                // Ready again once the client's next slots are leased.
                Token::Lease => {
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.busy = false;
                    }
                    self.rate_waiting
                        .entry(key.0.clone())
                        .or_default()
                        .push_back(key);
                    continue;
                }
            }
            // Its client's slot (if it has a rate) is taken: the next head waiting for one
            // tries for the next.
            self.next_rate_waiting(&key.0);
            *self.client_inflight.entry(key.0.clone()).or_default() += 1;
            self.inflight += 1;
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.out = true;
            }
            batch.push((key, id));
        }
        batch
    }
}

/// How many heads of `client` may be out at once: its share, or one while its endpoint
/// does not answer.
fn limit_of(unanswered: &FastSet<Arc<str>>, share: u32, client: &str) -> u32 {
    if unanswered.contains(client) {
        1
    } else {
        share
    }
}
