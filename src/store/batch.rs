//! The rows one group commit makes durable: what the engine produces from readings and
//! the backends write in one transaction. Defined here, beside the trait that takes them,
//! so the store depends on nothing above it.

use crate::domain::{Connection, Event, Millis, SensorId};

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
}

/// Everything one group commit makes durable, in one transaction: history rows, state
/// rows, events, and one notification per linked client for every event.
#[derive(Debug, Clone, Default)]
pub struct CommitBatch {
    pub readings: Vec<ReadingRecord>,
    pub states: Vec<StateUpdate>,
    pub events: Vec<Event>,
}

impl CommitBatch {
    pub fn is_empty(&self) -> bool {
        self.readings.is_empty() && self.states.is_empty() && self.events.is_empty()
    }

    pub fn append(&mut self, other: CommitBatch) {
        self.readings.extend(other.readings);
        self.states.extend(other.states);
        self.events.extend(other.events);
    }
}
