//! The registry's change log as the nodes follow it (`ClusterStore::registry_changes`).

use super::super::tests::fresh;
use super::*;
use crate::store::conformance;
use crate::store::prelude::*;

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

/// A sensor deleted and made again between two reads of the change log is followed as two
/// lives: listed deleted, then with its state now, so the node serving it drops the old
/// life's memory (simulation seeds 832, 917, 1204 once the workload deleted sensors: the
/// new life was reminded of as lost).
#[tokio::test]
async fn a_sensor_deleted_and_made_again_is_listed_deleted_first() {
    let Some((store, _)) = fresh().await else {
        return;
    };
    store
        .create_sensor(conformance::sensor("rc1"))
        .await
        .unwrap();
    store
        .create_sensor(conformance::sensor("rc2"))
        .await
        .unwrap();
    let after = store.newest_registry_change().await.unwrap();
    assert!(store.delete_sensor(sid("rc1"), 1_000).await.unwrap());
    store
        .create_sensor(conformance::sensor("rc1"))
        .await
        .unwrap();
    assert!(store.delete_sensor(sid("rc2"), 1_000).await.unwrap());
    let (_, changes) = store.registry_changes(after).await.unwrap();
    let seen: Vec<(SensorId, bool)> = changes
        .iter()
        .map(|(id, now)| (*id, now.is_some()))
        .collect();
    assert_eq!(
        seen,
        [(sid("rc1"), false), (sid("rc1"), true), (sid("rc2"), false)]
    );
}
