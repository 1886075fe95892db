//! What latch tells its operator happened, as types: each event writes its log line and
//! its metrics in one [`Emit::emit`], so a log line and the count beside it cannot drift
//! apart, and the list of what latch reports is read here rather than gathered from every
//! loop. The metric families themselves are named in [`super::families`].

mod cluster;
mod delivery;
mod history;
mod service;
mod sites;
mod store;

pub use cluster::{ClusterLeft, ForwardFailed, PartitionsHeld, PartitionsTaken};
pub use delivery::{ClientEnabled, ClientsDisabled, OutcomesAbandoned, OutcomesNotRecorded};
pub use history::{ClickHouseUp, RetentionDeleted, ShipFailed, Shipped, SpoolDepth};
pub use service::{AuthRefused, Checkpointed, MqttReconnecting, SourcePaused, TaskPanicked};
pub use sites::{
    AlarmTotalsCounted, SilencesReconcileFailed, SilencesReconciled, SiteChanged,
    SiteTotalsCounted, SitesDecideFailed, SitesDecided,
};
pub use store::{CommitFailed, DoubtOutcome, DoubtSettled, StorageFreed, StorageFull};

/// An event latch reports: its log line and its metrics, together.
pub trait Emit {
    fn emit(self);
}
