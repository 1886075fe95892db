//! The last hour of this node's activity in 10-second buckets: readings accepted, state
//! changes, webhook attempts delivered and failed, sensors lost and restored. The console's
//! charts draw from it (`GET /v1/fleet/rates`), so they are full the moment a page opens
//! rather than only as old as the browser tab that sampled `/metrics`.
//!
//! Fixed in size (360 buckets × 6 counters, about 17 KiB) and lock-free: each counter of a
//! bucket is one `AtomicU64` holding the bucket's number (its top 24 bits) beside its count
//! (the low 40), so adding to a bucket that holds an older one starts it afresh in the same
//! compare-and-swap, and nothing ever sweeps the ring. Callers add once per group commit or
//! per attempt, never per reading. One ring per service (not a process-wide static), so
//! several latch instances in one process — the integration tests — each count their own.
//!
//! Times are the service [`crate::clock::Clock`]'s, so a test on a manual clock moves the
//! buckets with it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::domain::Millis;

/// Width of one bucket.
pub const BUCKET_MS: Millis = 10_000;
/// Buckets kept: one hour.
pub const BUCKETS: usize = 360;

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Readings made durable (here: a forwarded reading counts at the node that owns it).
    Readings = 0,
    /// `sensor.state_changed` events committed.
    Changes = 1,
    /// Delivery attempts that delivered (webhook 2xx, broker acknowledgement).
    Delivered = 2,
    /// Delivery attempts that failed (any other answer, a timeout, a refused destination).
    Failed = 3,
    /// Sensors declared lost.
    Lost = 4,
    /// Sensors restored.
    Restored = 5,
}

impl Measure {
    pub const ALL: [Measure; 6] = [
        Measure::Readings,
        Measure::Changes,
        Measure::Delivered,
        Measure::Failed,
        Measure::Lost,
        Measure::Restored,
    ];
}

const MEASURES: usize = Measure::ALL.len();
const COUNT_BITS: u32 = 40;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const STAMP_BITS: u32 = 64 - COUNT_BITS;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;

/// The ring; share it as `Arc<Recent>`.
pub struct Recent {
    cells: Box<[[AtomicU64; MEASURES]]>,
}

impl std::fmt::Debug for Recent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recent").finish_non_exhaustive()
    }
}

impl Default for Recent {
    fn default() -> Self {
        Self::new()
    }
}

/// The bucket holding time `at`.
pub fn bucket_of(at: Millis) -> i64 {
    at.div_euclid(BUCKET_MS)
}

/// Counts per bucket, oldest first, for buckets `end - BUCKETS + 1 ..= end`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Series {
    /// The newest bucket's number ([`bucket_of`]).
    pub end: i64,
    /// One column per [`Measure`], in [`Measure::ALL`]'s order, each [`BUCKETS`] long.
    pub columns: [Vec<u64>; MEASURES],
}

impl Series {
    pub fn column(&self, m: Measure) -> &[u64] {
        &self.columns[m as usize]
    }

    /// Adds `other` (another node's series ending at the same bucket) into this one.
    pub fn add(&mut self, other: &Series) {
        for (mine, theirs) in self.columns.iter_mut().zip(&other.columns) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a = a.saturating_add(*b);
            }
        }
    }
}

impl Recent {
    pub fn new() -> Self {
        Self {
            cells: (0..BUCKETS)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }

    /// Counts `n` of `m` at time `at`.
    pub fn add(&self, m: Measure, n: u64, at: Millis) {
        if n == 0 {
            return;
        }
        let bucket = bucket_of(at);
        let stamp = bucket as u64 & STAMP_MASK;
        let cell = &self.cells[bucket.rem_euclid(BUCKETS as i64) as usize][m as usize];
        let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            let held = v >> COUNT_BITS;
            if held == stamp {
                Some((stamp << COUNT_BITS) | ((v & COUNT_MAX) + n).min(COUNT_MAX))
            } else if v & COUNT_MAX == 0
                || stamp.wrapping_sub(held) & STAMP_MASK < 1 << (STAMP_BITS - 1)
            {
                // The cell is empty or holds an older bucket: this one starts afresh.
                Some((stamp << COUNT_BITS) | n.min(COUNT_MAX))
            } else {
                // The cell already holds a newer bucket (the clock stepped back): dropped.
                None
            }
        });
    }

    /// The hour of complete buckets before the one holding `now`: the bucket in progress
    /// would read as a drop in every rate.
    pub fn last_hour(&self, now: Millis) -> Series {
        self.ending(bucket_of(now) - 1)
    }

    /// The [`BUCKETS`] buckets up to and including bucket `end`; a bucket the ring no
    /// longer (or not yet) holds counts 0.
    pub fn ending(&self, end: i64) -> Series {
        let mut columns: [Vec<u64>; MEASURES] =
            std::array::from_fn(|_| Vec::with_capacity(BUCKETS));
        for b in end - BUCKETS as i64 + 1..=end {
            let stamp = b as u64 & STAMP_MASK;
            let cells = &self.cells[b.rem_euclid(BUCKETS as i64) as usize];
            for (col, cell) in columns.iter_mut().zip(cells) {
                let v = cell.load(Ordering::Relaxed);
                col.push(if v >> COUNT_BITS == stamp {
                    v & COUNT_MAX
                } else {
                    0
                });
            }
        }
        Series { end, columns }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_795_341_600_000;

    #[test]
    fn counts_land_in_their_bucket_and_the_bucket_in_progress_is_left_out() {
        let r = Recent::new();
        r.add(Measure::Readings, 5, T0);
        r.add(Measure::Readings, 2, T0 + 9_999);
        r.add(Measure::Failed, 1, T0 + 10_000);
        let s = r.last_hour(T0 + 25_000);
        assert_eq!(s.end, bucket_of(T0) + 1);
        let readings = s.column(Measure::Readings);
        assert_eq!(readings.len(), BUCKETS);
        assert_eq!(readings[BUCKETS - 2], 7);
        assert_eq!(readings[BUCKETS - 1], 0);
        assert_eq!(s.column(Measure::Failed)[BUCKETS - 1], 1);
        assert_eq!(s.column(Measure::Delivered).iter().sum::<u64>(), 0);
        // In progress: not shown yet.
        assert_eq!(
            r.last_hour(T0 + 5_000).column(Measure::Readings)[BUCKETS - 1],
            0
        );
    }

    #[test]
    fn an_hour_later_a_bucket_is_reused_and_starts_afresh() {
        let r = Recent::new();
        r.add(Measure::Changes, 3, T0);
        let later = T0 + BUCKETS as Millis * BUCKET_MS;
        // While `later`'s bucket is in progress, T0's is still the oldest of the hour;
        // once it is complete, T0's is gone from the view, before its slot is reused.
        assert_eq!(r.last_hour(later + 1).column(Measure::Changes)[0], 3);
        let after = r.last_hour(later + BUCKET_MS);
        assert_eq!(after.column(Measure::Changes).iter().sum::<u64>(), 0);
        r.add(Measure::Changes, 4, later);
        let s = r.last_hour(later + BUCKET_MS);
        assert_eq!(s.column(Measure::Changes)[BUCKETS - 1], 4);
        assert_eq!(s.column(Measure::Changes).iter().sum::<u64>(), 4);
        // A late add for the lapped bucket does not clobber the newer one.
        r.add(Measure::Changes, 9, T0);
        assert_eq!(
            r.last_hour(later + BUCKET_MS).column(Measure::Changes)[BUCKETS - 1],
            4
        );
    }

    #[test]
    fn series_of_two_nodes_add_up() {
        let (a, b) = (Recent::new(), Recent::new());
        a.add(Measure::Lost, 2, T0);
        b.add(Measure::Lost, 3, T0);
        b.add(Measure::Restored, 1, T0);
        let end = bucket_of(T0);
        let mut sum = a.ending(end);
        sum.add(&b.ending(end));
        assert_eq!(sum.column(Measure::Lost)[BUCKETS - 1], 5);
        assert_eq!(sum.column(Measure::Restored)[BUCKETS - 1], 1);
    }

    #[test]
    fn adds_from_many_threads_are_all_counted() {
        let r = std::sync::Arc::new(Recent::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        r.add(Measure::Readings, 1, T0 + (i % 3) * BUCKET_MS);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = r.ending(bucket_of(T0) + 2);
        assert_eq!(s.column(Measure::Readings).iter().sum::<u64>(), 40_000);
    }
}
