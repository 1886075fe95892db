//! The queue of sensors a shard has found due and will declare lost, in sensor-id order.
//!
//! Every table and index the lost state is written to is keyed by sensor, so a commit of
//! neighbouring ids dirties a few pages where one scattered over the id space rewrites a
//! page per sensor. The queue is bounded ([`super::DUE_MAX`]); an outage larger than that
//! is cut into ranges of ids that each fit ([`Windows`]), so each batch of it stays as
//! narrow as if the whole outage had been sorted at once: taking the first `cap` sensors
//! in deadline order instead would spread each batch over the whole id space.

use super::part::Part;
use crate::domain::{Millis, SensorId};

/// Buckets of the id range an outage's plan counts sensors in.
const BUCKETS: usize = 4096;

/// A sensor found due: 16 bytes where `(SensorId, u32)` takes 32, since a fleet-wide
/// outage queues up to the cap of them.
#[derive(Clone, Copy)]
pub(super) struct Due {
    /// The packed id's low 64 and high 32 bits (ids pack into 96).
    lo: u64,
    hi: u32,
    pub(super) partition: u32,
}

impl Due {
    fn new(id: SensorId, partition: u32) -> Self {
        let packed = id.packed();
        Self {
            lo: packed as u64,
            hi: (packed >> 64) as u32,
            partition,
        }
    }

    pub(super) fn id(self) -> SensorId {
        SensorId::from_packed(((self.hi as u128) << 64) | self.lo as u128)
    }
}

/// The due sensors of an outage larger than the queue, cut into id ranges of at most the
/// queue's cap each (by a count of the sensors per bucket of the id range), taken in turn.
#[derive(Debug, PartialEq)]
struct Windows {
    min: u128,
    span: u128,
    /// The end (exclusive bucket) of each range; each starts where the one before ended.
    ends: Vec<usize>,
    next: usize,
}

impl Windows {
    /// Cuts the buckets into ranges of at most `cap` sensors (a bucket holding more than
    /// `cap` is a range of its own, and the queue takes `cap` of it).
    fn cut(min: u128, span: u128, counts: &[usize], cap: usize) -> Self {
        let mut ends = Vec::new();
        let mut sum = 0;
        for (b, &n) in counts.iter().enumerate() {
            if sum > 0 && sum + n > cap {
                ends.push(b);
                sum = 0;
            }
            sum += n;
        }
        ends.push(counts.len());
        Self {
            min,
            span,
            ends,
            next: 0,
        }
    }

    /// The next range of buckets, `None` when all were taken.
    fn take(&mut self) -> Option<(usize, usize)> {
        let end = *self.ends.get(self.next)?;
        let start = match self.next {
            0 => 0,
            n => self.ends[n - 1],
        };
        self.next += 1;
        Some((start, end))
    }
}

/// The bucket of a packed id in `[min, min + span]`, cut into [`BUCKETS`] equal parts.
fn bucket(packed: u128, min: u128, span: u128) -> usize {
    // Ids pack into 96 bits, so the product fits in 128.
    (packed.saturating_sub(min).min(span) * BUCKETS as u128 / (span + 1)) as usize
}

/// Calls `f` with each due sensor of the shard's partitions (partition by partition, each
/// in deadline order) until it returns false.
fn each_due(parts: &[Option<Part>], upto: Millis, mut f: impl FnMut(SensorId, u32) -> bool) {
    for (n, part) in parts.iter().enumerate() {
        let Some(part) = part else { continue };
        let mut more = true;
        part.fleet.each_expired(upto, |id, _| {
            more = f(id, n as u32);
            more
        });
        if !more {
            return;
        }
    }
}

/// See the module doc.
pub(super) struct DueQueue {
    /// In descending id order: the next at the end.
    items: Vec<Due>,
    cap: usize,
    windows: Option<Windows>,
}

impl DueQueue {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            items: Vec::new(),
            cap: cap.max(1),
            windows: None,
        }
    }

    pub(super) fn pop(&mut self) -> Option<Due> {
        self.items.pop()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Lets go of an outage's memory once it is worked off, for the quiet times after it.
    pub(super) fn shrink(&mut self, keep: usize) {
        if self.items.is_empty() && self.windows.is_none() && self.items.capacity() > keep {
            self.items = Vec::new();
        }
    }

    /// Fills the empty queue with sensors due at `upto`: all of them when they fit,
    /// otherwise the next range of ids of the outage's plan. Each sensor is checked again
    /// when taken, since a reading may have moved its deadline meanwhile; one left behind
    /// (a failed commit, a range that overflowed) is found when the plan is used up.
    pub(super) fn refill(&mut self, parts: &[Option<Part>], upto: Millis) {
        debug_assert!(self.items.is_empty());
        while let Some(w) = self.windows.as_mut() {
            let Some(range) = w.take() else {
                self.windows = None;
                break;
            };
            let (min, span) = (w.min, w.span);
            let (items, cap) = (&mut self.items, self.cap);
            each_due(parts, upto, |id, n| {
                if (range.0..range.1).contains(&bucket(id.packed(), min, span)) {
                    items.push(Due::new(id, n));
                }
                items.len() < cap
            });
            if !self.items.is_empty() {
                self.sort();
                return;
            }
        }
        let (items, cap) = (&mut self.items, self.cap);
        let mut full = false;
        each_due(parts, upto, |id, n| {
            if items.len() == cap {
                full = true;
                return false;
            }
            items.push(Due::new(id, n));
            true
        });
        if full {
            self.items.clear();
            self.windows = Some(self.plan(parts, upto));
            self.refill(parts, upto);
            return;
        }
        self.sort();
    }

    /// Counts the due sensors per bucket of their id range and cuts it into windows.
    fn plan(&self, parts: &[Option<Part>], upto: Millis) -> Windows {
        let (mut min, mut max) = (u128::MAX, 0);
        each_due(parts, upto, |id, _| {
            let k = id.packed();
            min = min.min(k);
            max = max.max(k);
            true
        });
        let span = max.saturating_sub(min);
        let mut counts = vec![0; BUCKETS];
        each_due(parts, upto, |id, _| {
            counts[bucket(id.packed(), min, span)] += 1;
            true
        });
        Windows::cut(min, span, &counts, self.cap)
    }

    fn sort(&mut self) {
        self.items
            .sort_unstable_by_key(|d| std::cmp::Reverse((d.hi, d.lo)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Connection;
    use crate::engine::fleet::Fleet;
    use crate::engine::tests::online;

    /// Three partitions of `n` sensors, last seen in the reverse of id order: deadline
    /// order is the reverse of id order, and each partition holds every third id.
    fn parts(n: usize) -> (Vec<Option<Part>>, Vec<SensorId>) {
        let mut parts: Vec<Option<Part>> = (0..3)
            .map(|_| {
                Some(Part {
                    fleet: Fleet::new(crate::engine::fleet::Policy::timeout(10_000), 0),
                    epoch: None,
                    unsure_until: 0,
                })
            })
            .collect();
        let ids: Vec<SensorId> = (0..n)
            .map(|i| SensorId::parse(&format!("s{i:04}")).unwrap())
            .collect();
        for (i, &id) in ids.iter().enumerate().rev() {
            let part = parts[i % 3].as_mut().unwrap();
            part.fleet.insert(id, online(1_000 - i as Millis));
        }
        (parts, ids)
    }

    /// Takes everything the queue yields until it is empty, declaring each lost.
    fn drain(q: &mut DueQueue, parts: &mut [Option<Part>]) -> Vec<Vec<SensorId>> {
        let mut rounds = Vec::new();
        loop {
            q.refill(parts, 20_000);
            let mut round = Vec::new();
            while let Some(d) = q.pop() {
                let fleet = &mut parts[d.partition as usize].as_mut().unwrap().fleet;
                let mut s = fleet.get(d.id()).unwrap();
                s.connection = Connection::Lost;
                fleet.update(d.id(), s);
                round.push(d.id());
            }
            if round.is_empty() {
                return rounds;
            }
            rounds.push(round);
        }
    }

    #[test]
    fn an_outage_that_fits_is_taken_whole_in_id_order() {
        let (mut parts, ids) = parts(50);
        let mut q = DueQueue::new(50);
        assert_eq!(drain(&mut q, &mut parts), [ids]);
    }

    #[test]
    fn an_outage_larger_than_the_queue_is_taken_a_range_of_ids_at_a_time() {
        let (mut parts, ids) = parts(200);
        let mut q = DueQueue::new(16);
        let rounds = drain(&mut q, &mut parts);
        // Every round fits the queue and holds the lowest ids not yet taken: in deadline
        // order, the first 16 would have been the highest ids, from every partition.
        assert!(rounds.iter().all(|r| !r.is_empty() && r.len() <= 16));
        assert!(rounds.len() <= 200 / 16 * 2, "{} rounds", rounds.len());
        assert_eq!(rounds.concat(), ids, "each sensor once, all in id order");
        assert!(q.windows.is_none(), "the plan is let go once used up");
    }

    /// A sensor seen before its range is gathered is not queued; one seen while already
    /// queued is the shard's check when taken (`engine::tests`, a queued sensor seen).
    #[test]
    fn a_sensor_seen_during_the_outage_is_skipped_and_one_missed_is_found_later() {
        let (mut parts, ids) = parts(100);
        let mut q = DueQueue::new(16);
        q.refill(&parts, 20_000);
        let first: Vec<SensorId> = std::iter::from_fn(|| q.pop().map(|d| d.id())).collect();
        assert_eq!(first, ids[..first.len()]);
        // The first round's sensors are not declared lost (a failed commit), and the last
        // sensor reports: the ranges go on without them, and the failed ones come after.
        let last = ids[99];
        let fleet = &mut parts[99 % 3].as_mut().unwrap().fleet;
        fleet.update(last, online(15_000));
        let rounds = drain(&mut q, &mut parts);
        let mut want: Vec<SensorId> = ids[first.len()..99].to_vec();
        want.extend_from_slice(&first);
        assert_eq!(rounds.concat(), want);
    }

    #[test]
    fn buckets_cover_the_range_in_order() {
        let (min, span) = (1_000u128, 99_999u128);
        assert_eq!(bucket(min, min, span), 0);
        assert_eq!(bucket(min + span, min, span), BUCKETS - 1);
        assert!(bucket(50_000, min, span) <= bucket(50_001, min, span));
        // A range narrower than the buckets: each id its own bucket, the last in bounds.
        assert_eq!(bucket(1_999, 1_000, 999), 999 * BUCKETS / 1_000);
        // One id (span 0) and ids outside the planned range stay in bounds.
        assert_eq!(bucket(7, 7, 0), 0);
        assert_eq!(bucket(500_000, min, span), BUCKETS - 1);
        assert_eq!(bucket(3, min, span), 0);
        // The widest range ids can have.
        assert_eq!(bucket(u128::MAX >> 32, 0, u128::MAX >> 32), BUCKETS - 1);
    }

    #[test]
    fn windows_hold_at_most_the_cap_and_cover_every_bucket() {
        let counts = [3, 0, 2, 2, 5, 1, 1];
        let mut w = Windows::cut(0, 0, &counts, 4);
        let mut ranges = Vec::new();
        while let Some(r) = w.take() {
            ranges.push(r);
        }
        // 3 | 2+2 | 5 (over the cap, alone) | 1+1
        assert_eq!(ranges, [(0, 2), (2, 4), (4, 5), (5, 7)]);
        assert_eq!(w.take(), None);
    }
}
