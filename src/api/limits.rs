//! Request rate limits (`rate_limit`): one token bucket per caller — per API token, or per
//! peer address when the API is open — on this node. A request takes one unit whatever it
//! carries, so a batch of 10,000 readings counts as much as one.
//!
//! The same buckets count failed authentications per peer address
//! (`auth_failure_limit`): a failure takes one, and an address whose bucket is empty is
//! answered 429 before its token is even looked at ([`Limiter::wait`]).
//!
//! Per node and in memory: nodes of a cluster do not share buckets, so behind a balancer
//! over N nodes a caller may get up to N times the rate. A shared limiter would put a
//! round trip to the store on every request, which is what the limit protects.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::RateLimit;

/// Whose bucket a request takes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// `LATCH_API_TOKEN`.
    Bootstrap,
    /// A token made with `POST /v1/tokens`, by id.
    Token(String),
    /// No token (an open API): the peer address.
    Peer(IpAddr),
}

/// Buckets kept before the full ones are dropped (a full bucket is the same as none).
const PRUNE_ABOVE: usize = 4096;

/// A token bucket: `level` requests available at `at`, refilled at the limit's rate.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn full(limit: RateLimit, now: Instant) -> Self {
        Bucket {
            level: limit.burst as f64,
            at: now,
        }
    }

    fn refill(&mut self, limit: RateLimit, now: Instant) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() * limit.per_second;
        self.level = (self.level + gained).min(limit.burst as f64);
        self.at = now;
    }

    /// Takes one request, or says how long until one is there.
    fn take(&mut self, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        self.refill(limit, now);
        if self.level >= 1.0 {
            self.level -= 1.0;
            Ok(())
        } else {
            Err(self.wait(limit))
        }
    }

    /// How long until one request is there (the level is below one).
    fn wait(&self, limit: RateLimit) -> Duration {
        Duration::from_secs_f64((1.0 - self.level) / limit.per_second)
    }
}

/// Every caller's bucket, by `K`: a [`Key`] for requests, a peer address for failed
/// authentications. A `std::sync::Mutex`, not a Tokio one: it is held for a hash lookup
/// and a few float operations, never across an `.await`.
pub struct Limiter<K = Key> {
    limit: RateLimit,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Eq + Hash> Limiter<K> {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket at `now`; `Err` is the wait until the next.
    pub fn check(&self, key: K, now: Instant) -> Result<(), Duration> {
        let limit = self.limit;
        self.with(key, now, |b| b.take(limit, now))
    }

    /// Whether `key`'s bucket holds one unit at `now`, without taking it; `Err` is the wait.
    pub fn wait(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let limit = self.limit;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        match buckets.get_mut(key) {
            Some(b) => {
                b.refill(limit, now);
                if b.level >= 1.0 {
                    Ok(())
                } else {
                    Err(b.wait(limit))
                }
            }
            None => Ok(()),
        }
    }

    /// Runs `f` on `key`'s bucket, made full when there is none; full buckets are dropped
    /// first when there are many (a full bucket is the same as none).
    fn with<T>(&self, key: K, now: Instant, f: impl FnOnce(&mut Bucket) -> T) -> T {
        let limit = self.limit;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= PRUNE_ABOVE && !buckets.contains_key(&key) {
            buckets.retain(|_, b| {
                b.refill(limit, now);
                b.level < limit.burst as f64
            });
        }
        f(buckets
            .entry(key)
            .or_insert_with(|| Bucket::full(limit, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter<K: Eq + Hash>(per_second: f64, burst: u32) -> Limiter<K> {
        Limiter::new(RateLimit { per_second, burst })
    }

    #[test]
    fn a_burst_then_the_rate() {
        let l = limiter(2.0, 3);
        let t0 = Instant::now();
        let k = || Key::Token("a".into());
        for _ in 0..3 {
            assert!(l.check(k(), t0).is_ok());
        }
        let wait = l.check(k(), t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Half a second refills one request, not more.
        let t1 = t0 + Duration::from_millis(500);
        assert!(l.check(k(), t1).is_ok());
        assert!(l.check(k(), t1).is_err());
        // A long pause refills to the burst, never beyond.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(l.check(k(), t2).is_ok());
        }
        assert!(l.check(k(), t2).is_err());
    }

    #[test]
    fn callers_have_their_own_buckets() {
        let l = limiter(1.0, 1);
        let t0 = Instant::now();
        assert!(l.check(Key::Token("a".into()), t0).is_ok());
        assert!(l.check(Key::Token("a".into()), t0).is_err());
        assert!(l.check(Key::Token("b".into()), t0).is_ok());
        assert!(l.check(Key::Bootstrap, t0).is_ok());
        assert!(l.check(Key::Peer([127, 0, 0, 1].into()), t0).is_ok());
    }

    #[test]
    fn waiting_takes_nothing_and_failures_past_the_burst_make_one_wait() {
        let l: Limiter<IpAddr> = limiter(0.5, 2);
        let (peer, t0) = (IpAddr::from([10, 0, 0, 1]), Instant::now());
        assert!(l.wait(&peer, t0).is_ok(), "no failure yet");
        for _ in 0..2 {
            assert!(l.wait(&peer, t0).is_ok());
            let _ = l.check(peer, t0);
        }
        assert_eq!(l.wait(&peer, t0), Err(Duration::from_secs(2)));
        assert_eq!(
            l.wait(&peer, t0),
            Err(Duration::from_secs(2)),
            "waiting is free"
        );
        assert!(l.wait(&peer, t0 + Duration::from_secs(2)).is_ok());
        assert!(l.wait(&IpAddr::from([10, 0, 0, 2]), t0).is_ok());
    }

    #[test]
    fn full_buckets_are_dropped_not_kept_for_ever() {
        let l = limiter(1000.0, 1);
        let t0 = Instant::now();
        for i in 0..PRUNE_ABOVE as u32 {
            let _ = l.check(Key::Peer(IpAddr::from(i.to_be_bytes())), t0);
        }
        let later = t0 + Duration::from_secs(1);
        assert!(l.check(Key::Bootstrap, later).is_ok());
        assert_eq!(l.buckets.lock().unwrap().len(), 1);
    }
}
