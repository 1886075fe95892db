//! The rows one group commit makes durable: what the engine produces from readings and
//! the backends write in one transaction. Defined here, beside the trait that takes them,
//! so the store depends on nothing above it.

use crate::domain::sensor::Debounce;
use crate::domain::{Connection, Event, Millis, SensorId, Source};

/// One reading as kept in history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadingRecord {
    pub sensor_id: SensorId,
    pub data: bool,
    /// Device time, or receive time when the device sent none.
    pub ts: Millis,
    pub received_at: Millis,
    /// Older than the last applied reading: kept, but did not change state.
    pub late: bool,
    /// Its battery, tamper flag and fault, as it reported them.
    pub signals: crate::domain::signals::Signals,
}

/// The new current state of one sensor after a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateUpdate {
    pub sensor_id: SensorId,
    pub data: Option<bool>,
    /// Set only when this batch changed the state; `None` keeps the stored one (memory does
    /// not hold it).
    pub changed_at: Option<Millis>,
    pub last_ts: Option<Millis>,
    pub last_seen_at: Option<Millis>,
    pub connection: Connection,
    pub last_source: Option<Source>,
    /// The change waiting out its debounce window, if one is (written as it is).
    pub debounce: Option<Debounce>,
    /// While lost: `None` keeps the stored value (memory may not hold it); not lost, the
    /// store clears both.
    pub lost_since: Option<Millis>,
    pub reminders: Option<u32>,
    /// Its battery, tamper flag and fault, and whether a battery alarm is open (written as
    /// they are).
    pub signals: crate::domain::signals::SignalState,
    /// How far its state has held (written as it is).
    pub hold: Option<crate::domain::hold::Hold>,
    /// Its count of changes and whether it flaps (written as it is).
    pub flapping: Option<crate::domain::flap::FlapState>,
    /// Nothing but `last_ts` and `last_seen_at` differs from the sensor's committed state
    /// ([`crate::domain::sensor::SensorState::only_seen_since`]). A backend may defer
    /// writing such an update, as long as no read of the store sees the older values and
    /// a crash loses none of them (SQLite: `store/sqlite/seen.rs`); PostgreSQL and the
    /// simulation's model write it like any other.
    pub seen_only: bool,
}

/// Everything one group commit makes durable, in one transaction: history rows, state
/// rows, events, and one notification per linked client for every event.
#[derive(Debug, Clone, Default)]
pub struct CommitBatch {
    pub readings: Vec<ReadingRecord>,
    pub states: Vec<StateUpdate>,
    pub events: Vec<Event>,
    /// Cluster mode: the partitions whose sensors this batch writes, each with the epoch
    /// of this node's lease. The commit checks them in its transaction and writes nothing
    /// when one is no longer held at that epoch ([`super::Error::Fenced`]). Empty on one
    /// node.
    pub fence: Vec<Fence>,
    /// Requests sent with an `Idempotency-Key`: which of their readings this batch applies,
    /// kept in its transaction so that a repeat of the request applies none of them again.
    pub keyed: Vec<Keyed>,
}

/// The readings of one keyed request that a batch applies, by their positions in the
/// request (the same body sent again has them at the same positions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    pub key: std::sync::Arc<str>,
    pub positions: Vec<u32>,
}

/// A partition as this node holds it: the lease's epoch grows at every change of owner,
/// so `(partition, epoch)` names one holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence {
    pub partition: u32,
    pub epoch: i64,
}

impl CommitBatch {
    pub fn is_empty(&self) -> bool {
        self.readings.is_empty() && self.states.is_empty() && self.events.is_empty()
    }

    pub fn append(&mut self, other: CommitBatch) {
        self.readings.extend(other.readings);
        self.states.extend(other.states);
        self.events.extend(other.events);
        self.keyed.extend(other.keyed);
        for f in other.fence {
            if !self.fence.contains(&f) {
                self.fence.push(f);
            }
        }
    }
}
