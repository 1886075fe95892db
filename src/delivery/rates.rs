//! Clients' `rate_limit`: their requests evenly spaced, at most one per interval.
//!
//! One node (the embedded store) paces its own requests: each client's next request may
//! go one interval after the last. In a cluster a client's sensors spread over every node,
//! so pacing per node would let it receive the limit times the nodes; instead the cluster
//! shares one schedule of request slots per client, kept in PostgreSQL
//! ([`crate::store::ClusterStore::grant_rate`]). A node leases the next slots a few at a
//! time (a tenth of a second's worth, one statement per lease) and sends one request per
//! slot, never before its slot starts and never after it ends (a slot it could not use is
//! dropped, not saved up), so however the slots fall to the nodes no two requests of the
//! client share one. A node asks for the next lease when half of its lease is left (so
//! the next is there when its requests are due, not a round trip later), so a node that
//! stops asking holds none; what a node leased and could not use is the only cost: up to
//! a tenth and a half of a second of the client's rate, when its work runs out.
//!
//! This is the state machine only: [`Rates::take`] says whether a request may go now, and
//! [`Rates::wanted`] which leases to ask the store for; the dispatcher asks and hands the
//! answers back with [`Rates::granted`].

use crate::hashing::FastMap as HashMap;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::domain::Millis;

/// Slots leased at once: this long of the client's rate.
const LEASE_US: i64 = 100_000;

/// Whether a client's next request may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Token {
    /// Now (its slot is taken).
    Go,
    /// At this time (ms), when its slot starts.
    At(Millis),
    /// Once a lease of slots comes from the store.
    Lease,
}

/// A lease to ask the store for: `tokens` slots of `client`, `interval_us` apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Wanted {
    pub client: Arc<str>,
    pub tokens: u32,
    pub interval_us: i64,
}

/// A lease as the store gave it: times in microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lease {
    /// When the first slot starts, by the database's clock.
    pub first_us: i64,
    /// The database's now when it leased them.
    pub db_now_us: i64,
    /// This node's now when the answer came.
    pub received_us: i64,
    pub tokens: u32,
}

/// Answers whose clock offsets are kept (see [`Rates::offsets`]).
const OFFSETS_KEPT: usize = 32;

/// Every rate-limited client's pacing on this node.
#[derive(Debug, Default)]
pub(super) struct Rates {
    clients: HashMap<Arc<str>, Rate>,
    /// The schedule is the cluster's: slots come leased from the store.
    shared: bool,
    wanted: Vec<Wanted>,
    /// This node's clock minus the database's, as the last answers showed it (each a
    /// little more than the truth, by the answer's travel). Their least maps a lease's
    /// database times onto this node's clock; a lease that follows on from this node's
    /// last one in the database follows on from it here, so one answer taking longer than
    /// another leaves no gap or overlap.
    offsets: VecDeque<i64>,
}

#[derive(Debug, Clone)]
struct Rate {
    /// The client's `rate_limit`.
    per_second: u32,
    /// Microseconds between two requests.
    interval_us: i64,
    /// One node: when the next request may go, in microseconds since the epoch.
    next_us: i64,
    /// Shared: the slots leased and not used yet, in time order, as (when the first
    /// starts, in microseconds since the epoch; how many, one per interval).
    leases: VecDeque<(i64, u32)>,
    /// Shared: a lease was asked for and has not come yet.
    asked: bool,
    /// Shared: where the last lease ends, by the database's clock and on this node's.
    last_end: Option<(i64, i64)>,
}

impl Rate {
    /// Slots leased at once: [`LEASE_US`] of the rate.
    fn lease_size(&self) -> u32 {
        (LEASE_US / self.interval_us).max(1) as u32
    }

    fn left(&self) -> u32 {
        self.leases.iter().map(|l| l.1).sum()
    }

    /// Forgets the slots that ended unused before `now_us`: using one late would put two
    /// requests in the slot of whichever node holds the next.
    fn drop_ended(&mut self, now_us: i64) {
        while let Some(front) = self.leases.front_mut() {
            if front.0 + self.interval_us > now_us {
                return;
            }
            let ended = ((now_us - front.0) / self.interval_us).min(i64::from(front.1));
            front.1 -= ended as u32;
            front.0 += ended * self.interval_us;
            if front.1 > 0 {
                return;
            }
            self.leases.pop_front();
        }
    }
}

impl Rates {
    pub(super) fn new(shared: bool) -> Self {
        Self {
            shared,
            ..Self::default()
        }
    }

    /// Sets (or with `None` lifts) a client's limit of requests per second.
    pub(super) fn set(&mut self, client: &str, per_second: Option<u32>) {
        match per_second.filter(|r| *r > 0) {
            Some(r) => {
                let interval_us = 1_000_000 / i64::from(r);
                self.clients
                    .entry(Arc::from(client))
                    .and_modify(|l| {
                        l.per_second = r;
                        l.interval_us = interval_us;
                    })
                    .or_insert(Rate {
                        per_second: r,
                        interval_us,
                        next_us: i64::MIN,
                        leases: VecDeque::new(),
                        asked: false,
                        last_end: None,
                    });
            }
            None => {
                self.clients.remove(client);
            }
        }
    }

    /// The limit this node applies to `client` now.
    pub(super) fn limit(&self, client: &str) -> Option<u32> {
        self.clients.get(client).map(|r| r.per_second)
    }

    /// Whether a request of `client` may go at `now`; [`Token::Go`] takes its slot.
    pub(super) fn take(&mut self, client: &Arc<str>, now: Millis) -> Token {
        let Some(rate) = self.clients.get_mut(client) else {
            return Token::Go;
        };
        let now_us = now.saturating_mul(1000);
        if !self.shared {
            if rate.next_us > now_us {
                return Token::At(ceil_ms(rate.next_us));
            }
            rate.next_us = rate.next_us.max(now_us) + rate.interval_us;
            return Token::Go;
        }
        rate.drop_ended(now_us);
        let token = match rate.leases.front_mut() {
            None => Token::Lease,
            Some(front) if front.0 > now_us => Token::At(ceil_ms(front.0)),
            Some(front) => {
                front.1 -= 1;
                front.0 += rate.interval_us;
                if front.1 == 0 {
                    rate.leases.pop_front();
                }
                Token::Go
            }
        };
        // Half a lease left: the next is asked for now, so that it is here (following on
        // from this one, unless another node leased the slots between) before it is
        // needed, rather than a round trip after.
        if !rate.asked && rate.left() * 2 <= rate.lease_size() {
            rate.asked = true;
            self.wanted.push(Wanted {
                client: client.clone(),
                tokens: rate.lease_size(),
                interval_us: rate.interval_us,
            });
        }
        token
    }

    /// The leases to ask the store for, each once.
    pub(super) fn wanted(&mut self) -> Vec<Wanted> {
        std::mem::take(&mut self.wanted)
    }

    /// A lease of `client`'s slots came. `None`: asking failed (it is asked again when a
    /// request needs it).
    pub(super) fn granted(&mut self, client: &str, lease: Option<Lease>) {
        if let Some(l) = &lease {
            if self.offsets.len() == OFFSETS_KEPT {
                self.offsets.pop_front();
            }
            self.offsets.push_back(l.received_us - l.db_now_us);
        }
        let offset = self.offsets.iter().min().copied().unwrap_or(0);
        let Some(rate) = self.clients.get_mut(client) else {
            return;
        };
        rate.asked = false;
        let Some(lease) = lease.filter(|l| l.tokens > 0) else {
            return;
        };
        let first = match rate.last_end {
            // Right after this node's last lease in the database (no other node leased
            // between): right after it here too, whatever the clocks did meanwhile.
            Some((db_end, end)) if db_end == lease.first_us => end,
            // Never before the end of the last lease, should the offset have moved.
            Some((_, end)) => (lease.first_us + offset).max(end),
            None => lease.first_us + offset,
        };
        let span = i64::from(lease.tokens) * rate.interval_us;
        rate.last_end = Some((lease.first_us + span, first + span));
        rate.leases.push_back((first, lease.tokens));
    }
}

fn ceil_ms(us: i64) -> Millis {
    (us + 999).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tokens` slots from `first_us`, leased at `now_us` (the database's clock and this
    /// node's agreeing).
    fn lease(first_us: i64, tokens: u32, now_us: i64) -> Option<Lease> {
        Some(Lease {
            first_us,
            db_now_us: now_us,
            received_us: now_us,
            tokens,
        })
    }

    #[test]
    fn one_node_spaces_requests_evenly() {
        let mut r = Rates::new(false);
        let c: Arc<str> = Arc::from("c");
        assert_eq!(r.take(&c, 0), Token::Go, "no limit set");
        r.set("c", Some(50));
        assert_eq!(r.take(&c, 1_000), Token::Go);
        assert_eq!(r.take(&c, 1_000), Token::At(1_020));
        assert_eq!(r.take(&c, 1_020), Token::Go);
        assert!(r.wanted().is_empty(), "nothing leased on one node");
    }

    #[test]
    fn a_cluster_node_sends_only_in_leased_slots() {
        let mut r = Rates::new(true);
        let c: Arc<str> = Arc::from("c");
        r.set("c", Some(50));
        assert_eq!(r.take(&c, 1_000), Token::Lease);
        assert_eq!(r.take(&c, 1_000), Token::Lease);
        let wanted = r.wanted();
        assert_eq!(
            wanted,
            vec![Wanted {
                client: c.clone(),
                tokens: 5,
                interval_us: 20_000
            }],
            "asked once, a tenth of a second's worth"
        );
        // Five slots from 1.040 s: 1.040, 1.060, …, 1.120.
        r.granted("c", lease(1_040_000, 5, 1_000_000));
        assert_eq!(r.take(&c, 1_000), Token::At(1_040));
        assert_eq!(r.take(&c, 1_040), Token::Go);
        assert_eq!(r.take(&c, 1_041), Token::At(1_060));
        assert!(r.wanted().is_empty(), "four left");
        // The slots of 1.060 and 1.080 ended unused: dropped, not saved up.
        assert_eq!(r.take(&c, 1_105), Token::Go, "the slot of 1.100");
        assert_eq!(r.wanted().len(), 1, "one left: the next lease asked for");
        assert_eq!(r.take(&c, 1_105), Token::At(1_120));
        // It comes while the last slot is still ahead, and follows on.
        r.granted("c", lease(1_139_000, 5, 1_105_000));
        assert_eq!(r.take(&c, 1_120), Token::Go);
        assert_eq!(
            r.take(&c, 1_120),
            Token::At(1_140),
            "not before the lease's end"
        );
        for t in [1_140, 1_160, 1_180, 1_200, 1_220] {
            assert_eq!(r.take(&c, t), Token::Go, "{t}");
        }
        assert_eq!(r.take(&c, 1_220), Token::Lease, "all used");
        assert_eq!(r.wanted().len(), 1);
        // Asking failed: asked again by the next request.
        r.granted("c", None);
        assert_eq!(r.take(&c, 1_300), Token::Lease);
        assert_eq!(r.wanted().len(), 1);
        // A lease whose slots all ended while it came: nothing goes on it.
        r.granted("c", lease(1_000_000, 2, 1_300_000));
        assert_eq!(r.take(&c, 1_300), Token::Lease);
    }

    #[test]
    fn leases_follow_on_whatever_each_answer_took() {
        let mut r = Rates::new(true);
        let c: Arc<str> = Arc::from("c");
        r.set("c", Some(50));
        r.take(&c, 0);
        // This node's clock is 1 s ahead of the database's; the first answer took 2 ms,
        // the second 9 ms, the third 5: the two leases one after the other in the database
        // are one after the other here too, and the third is placed by the fastest answer.
        let at = |first_us, db_now_us, travel_us| {
            Some(Lease {
                first_us,
                db_now_us,
                received_us: db_now_us + 1_000_000 + travel_us,
                tokens: 5,
            })
        };
        r.granted("c", at(0, 0, 2_000));
        r.granted("c", at(100_000, 60_000, 9_000));
        // Another node leased 200–300 ms: the third lease is placed by the least offset.
        r.granted("c", at(300_000, 150_000, 5_000));
        let starts: Vec<i64> = r.clients["c"].leases.iter().map(|l| l.0).collect();
        assert_eq!(starts, vec![1_002_000, 1_102_000, 1_302_000]);
    }

    #[test]
    fn a_high_rate_leases_a_tenth_of_a_second_and_a_low_one_a_slot() {
        let mut r = Rates::new(true);
        let (hi, lo): (Arc<str>, Arc<str>) = (Arc::from("hi"), Arc::from("lo"));
        r.set("hi", Some(10_000));
        r.set("lo", Some(1));
        r.take(&hi, 0);
        r.take(&lo, 0);
        let tokens: Vec<u32> = r.wanted().iter().map(|w| w.tokens).collect();
        assert_eq!(tokens, vec![1_000, 1]);
        r.set("lo", None);
        assert_eq!(r.take(&lo, 0), Token::Go, "lifted");
    }
}
