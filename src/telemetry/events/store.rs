//! The store's own conditions: a full disk, a commit whose answer was lost.

use super::Emit;
use crate::telemetry::families;

/// The store's disk filled: readings are refused until space is freed.
pub struct StorageFull<'a> {
    pub cause: &'a str,
}

impl Emit for StorageFull<'_> {
    fn emit(self) {
        families::STORAGE_FULL.gauge().set(1.0);
        families::STORAGE_FULL_EPISODES.counter().increment(1);
        tracing::error!(error = %self.cause,
            "The store's disk is full: readings are refused (storage_full) until space is freed.");
    }
}

/// A write succeeded again after the disk was full.
pub struct StorageFreed;

impl Emit for StorageFreed {
    fn emit(self) {
        families::STORAGE_FULL.gauge().set(0.0);
        tracing::warn!("The store's disk has space again: readings are accepted.");
    }
}

/// How a PostgreSQL commit whose answer was lost turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoubtOutcome {
    Committed,
    /// Committed, but never ended (a synchronous standby that does not answer?).
    CommittedNotEnded,
    RolledBack,
    /// Not learnt within the bound.
    Unknown,
}

/// A commit whose answer was lost was settled.
pub struct DoubtSettled {
    pub xid: i64,
    pub outcome: DoubtOutcome,
}

impl Emit for DoubtSettled {
    fn emit(self) {
        let xid = self.xid;
        let label = match self.outcome {
            DoubtOutcome::Committed | DoubtOutcome::CommittedNotEnded => "committed",
            DoubtOutcome::RolledBack => "rolled_back",
            DoubtOutcome::Unknown => "unknown",
        };
        families::COMMITS_IN_DOUBT
            .counter_with(&[("outcome", label)])
            .increment(1);
        match self.outcome {
            DoubtOutcome::Committed => {
                tracing::info!(xid, "The commit whose answer was lost had committed.")
            }
            DoubtOutcome::CommittedNotEnded => tracing::warn!(
                xid,
                "A commit whose answer was lost has committed but not ended \
                 (a synchronous standby that does not answer?): taken as committed."
            ),
            DoubtOutcome::RolledBack => {
                tracing::warn!(xid, "The commit whose answer was lost was rolled back.")
            }
            DoubtOutcome::Unknown => {
                tracing::error!(xid, "Gave up waiting for a commit whose answer was lost.")
            }
        }
    }
}

/// A group commit failed (its readings were refused, or their fate is being learnt);
/// `fenced`: a partition it wrote had moved to another node.
pub struct CommitFailed {
    pub fenced: bool,
}

impl Emit for CommitFailed {
    fn emit(self) {
        families::COMMIT_FAILURES.counter().increment(1);
        if self.fenced {
            families::CLUSTER_FENCED_COMMITS.counter().increment(1);
        }
    }
}
