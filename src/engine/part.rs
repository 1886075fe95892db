//! A partition as a shard serves it: its sensors, and the lease it is served under.

use super::fleet::Fleet;
use crate::domain::Millis;

/// A partition a shard serves.
pub(super) struct Part {
    pub(super) fleet: Fleet,
    /// The lease's epoch in cluster mode (the commit's fence); `None` on one node.
    pub(super) epoch: Option<i64>,
    /// Until then a sensor unknown here may be one registered through another node while
    /// the partition's sensors were loading ([`super::TAKEOVER_GRACE_MS`]): its readings are
    /// refused as "send again", not as unknown.
    pub(super) unsure_until: Millis,
}
