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
