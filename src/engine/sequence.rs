//! A sequence: the batches one broker session hands the engine, one after another, whose
//! committed readings are acknowledged and whose others the broker delivers again.
//!
//! A redelivery starts at the first reading not acknowledged, and the source skips those
//! of the redelivered readings that committed (by AMQP `message_id`, by MQTT packet id).
//! That is only right if, for every sensor, what committed of the sequence comes before
//! what did not: skipping a committed `0` but applying again the `1` before it, which had
//! failed, would leave the sensor at `1`. Shards commit on their own and a pipelined source
//! has several batches in the engine at once, so a shard whose commit failed would go on
//! to commit the next batch's readings of the same sensors.
//!
//! So a sequence is cut at its first reading that does not commit (a failed commit, a
//! partition refused while it moves): from then on no shard applies another reading of it
//! and no forward carries one; all are refused as `store_unavailable`, for the broker to
//! deliver again. A reading of a partition whose route changed since the sequence's last
//! reading of it cuts it too: the answer from the old owner may still be on its way.

use crate::hashing::FastMap as HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Route;
use crate::domain::Rejection;
use crate::domain::reading::RejectCode;

/// One broker session's batches; cheap to clone (all clones are one sequence).
#[derive(Clone, Debug)]
pub struct Sequence(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Unique in this process: forwarded batches name their sequence by it.
    id: u64,
    cut: AtomicBool,
    /// Where each partition's readings of this sequence went last. A `std` mutex: held
    /// for a look-up, never across an `.await`.
    routes: Mutex<HashMap<u32, Route>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Default for Sequence {
    fn default() -> Self {
        Self::new()
    }
}

impl Sequence {
    pub fn new() -> Self {
        Self(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cut: AtomicBool::new(false),
            routes: Mutex::new(HashMap::default()),
        }))
    }

    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// No reading of the sequence is applied from now on.
    pub fn cut(&self) {
        self.0.cut.store(true, Ordering::Release);
    }

    pub fn is_cut(&self) -> bool {
        self.0.cut.load(Ordering::Acquire)
    }

    /// Whether a reading of `partition` may go by `route`: not when the sequence is cut,
    /// nor when its last reading of that partition went another way (the sequence is cut
    /// then).
    pub(super) fn admits(&self, partition: u32, route: &Route) -> bool {
        if self.is_cut() {
            return false;
        }
        let mut routes = self.0.routes.lock().expect("sequence routes");
        match routes.get(&partition) {
            Some(last) if last != route => {
                drop(routes);
                self.cut();
                false
            }
            Some(_) => true,
            None => {
                routes.insert(partition, route.clone());
                true
            }
        }
    }

    /// What a reading refused because the sequence is cut is told.
    pub fn refusal() -> Rejection {
        Rejection::new(
            RejectCode::StoreUnavailable,
            "an earlier reading of this stream was not stored; send it again",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_change_cuts_and_a_cut_is_for_good() {
        let s = Sequence::new();
        let a: Route = Route::Node("http://a".into());
        assert!(s.admits(1, &Route::Here) && s.admits(1, &Route::Here));
        assert!(s.admits(2, &a));
        assert!(!s.is_cut());
        assert!(!s.admits(2, &Route::Here), "partition 2 moved");
        assert!(s.is_cut());
        assert!(!s.admits(1, &Route::Here), "nothing more once cut");
        assert_ne!(Sequence::new().id(), s.id());
    }
}
