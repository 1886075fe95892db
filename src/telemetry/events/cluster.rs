//! A node's part in the cluster: partitions taken over, held and left.

use super::Emit;
use crate::telemetry::families;

/// This node took `partitions` over (free, released or expired leases).
pub struct PartitionsTaken<'a> {
    pub partitions: &'a [u32],
}

impl Emit for PartitionsTaken<'_> {
    fn emit(self) {
        families::CLUSTER_TAKEOVERS
            .counter()
            .increment(self.partitions.len() as u64);
        tracing::info!(partitions = ?self.partitions, "Took partitions over.");
    }
}

/// The partitions this node serves now, counted.
pub struct PartitionsHeld(pub usize);

impl Emit for PartitionsHeld {
    fn emit(self) {
        families::CLUSTER_PARTITIONS_OWNED
            .gauge()
            .set(self.0 as f64);
    }
}

/// This node left the cluster at its stop, handing `released` partitions back.
pub struct ClusterLeft {
    pub released: usize,
}

impl Emit for ClusterLeft {
    fn emit(self) {
        families::CLUSTER_PARTITIONS_OWNED.gauge().set(0.0);
        tracing::info!(partitions = self.released, "Left the cluster.");
    }
}

/// Readings forwarded to their partition's owner were not taken by it: their senders are
/// told to send again.
pub struct ForwardFailed<'a> {
    pub url: &'a dyn std::fmt::Display,
    pub error: &'a dyn std::fmt::Display,
}

impl Emit for ForwardFailed<'_> {
    fn emit(self) {
        families::CLUSTER_FORWARD_FAILURES.counter().increment(1);
        tracing::warn!(url = %self.url, error = %self.error,
            "Forwarding readings to their partition's owner failed.");
    }
}
