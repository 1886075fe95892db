//! The partitioning a database keeps: MD5 ranges for databases in use before the choice
//! was kept (upgraded from the previous schema), the exchange's function for new ones, and
//! every sensor's `hash` written by it, whichever way the sensor came in.

use std::time::Duration;

use super::super::tests::{fresh, schema_at};
use super::*;
use crate::domain::partition::hash32;
use crate::domain::{Sensor, SensorId};
use crate::store::conformance;
use crate::store::prelude::*;

/// The schema version before `0020_partition_scheme.sql`: a database of the version
/// before the partition scheme (later migrations come after it, whatever they are).
const BEFORE_SCHEME: usize = 19;

#[test]
fn the_version_before_the_scheme_is_the_one_before_its_migration() {
    assert!(super::super::MIGRATIONS[BEFORE_SCHEME].contains("scheme"));
}

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn sensor(id: &str) -> Sensor {
    conformance::sensor(id)
}

/// `sensors.hash` of `id` as stored.
async fn stored_hash(store: &PgStore, id: &str) -> i64 {
    let c = store.db.unbounded().await.unwrap();
    c.query_one("SELECT hash FROM sensors WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// Which of `ids` `load_partitions` finds in partition `p`.
async fn loaded(store: &PgStore, p: u32, count: u32) -> Vec<SensorId> {
    let mut got: Vec<SensorId> = store
        .load_partitions(&[p], count)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    got.sort();
    got
}

/// A cluster formed by the previous version: its partition count and MD5 ranges stay,
/// its sensors keep their hashes, new sensors get the MD5 one too (also when a node still
/// on the previous version inserts them, as it does, without the column), and each is
/// loaded with the partition MD5 puts it in.
#[tokio::test]
async fn a_cluster_database_of_the_previous_version_keeps_md5_partitions() {
    let Some((c, url)) = schema_at(BEFORE_SCHEME).await else {
        return;
    };
    c.batch_execute(
        "INSERT INTO latch_cluster (id, partitions) VALUES (1, 8); \
         INSERT INTO latch_partitions (partition) SELECT generate_series(0, 7); \
         INSERT INTO sensors (id, address, created_at) VALUES ('old1', 'here', 1)",
    )
    .await
    .unwrap();
    let old: i64 = c
        .query_one("SELECT hash FROM sensors WHERE id = 'old1'", &[])
        .await
        .unwrap()
        .get(0);

    let store = PgStore::connect(&url, Duration::from_secs(5))
        .await
        .unwrap()
        .wanting(16);
    let md5 = Partitioning::md5(8);
    assert_eq!(
        store.partitions(16).await.unwrap(),
        md5,
        "count and scheme kept"
    );
    assert_eq!(stored_hash(&store, "old1").await, old, "hash kept");
    assert_eq!(old, i64::from(hash32(sid("old1"))));

    store.create_sensor(sensor("new1")).await.unwrap();
    store
        .import(vec![sensor("new2")], Vec::new(), 1_000)
        .await
        .unwrap();
    // What the previous version's create_sensor sends.
    c.execute(
        "INSERT INTO sensors (id, address, created_at) VALUES ('prev1', 'here', 1)",
        &[],
    )
    .await
    .unwrap();
    for id in ["old1", "new1", "new2", "prev1"] {
        assert_eq!(
            stored_hash(&store, id).await,
            i64::from(hash32(sid(id))),
            "{id}: MD5"
        );
        let p = md5.of(sid(id));
        assert!(loaded(&store, p, 8).await.contains(&sid(id)), "{id} in {p}");
    }
}

/// Sensors registered by the previous version before any node formed the cluster have
/// MD5 hashes: the first node keeps MD5 rather than strand them in wrong partitions.
#[tokio::test]
async fn sensors_from_before_the_first_node_keep_the_database_on_md5() {
    let Some((c, url)) = schema_at(BEFORE_SCHEME).await else {
        return;
    };
    c.execute(
        "INSERT INTO sensors (id, address, created_at) VALUES ('early1', 'here', 1)",
        &[],
    )
    .await
    .unwrap();
    let store = PgStore::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(store.partitions(8).await.unwrap(), Partitioning::md5(8));
    let p = Partitioning::md5(8).of(sid("early1"));
    assert_eq!(loaded(&store, p, 8).await, vec![sid("early1")]);
}

/// A new database takes the exchange's function, fixed by its first user (here the first
/// sensor's registration, with the count the store was given); every way a sensor comes in
/// writes the hash of the exchange's bucket, and a row without one is refused.
#[tokio::test]
async fn a_new_database_partitions_by_the_exchanges_buckets() {
    let Some((store, _)) = fresh().await else {
        return;
    };
    let store = store.wanting(8);
    let ids: Vec<String> = (0..40).map(|i| format!("x{i}")).collect();
    store.create_sensor(sensor(&ids[0])).await.unwrap();
    store
        .import(
            ids[1..].iter().map(|id| sensor(id)).collect(),
            Vec::new(),
            1_000,
        )
        .await
        .unwrap();
    let ex = Partitioning::exchange(8);
    assert_eq!(store.partitioning().await.unwrap(), ex);
    assert_eq!(
        store.partitions(16).await.unwrap(),
        ex,
        "fixed at first use"
    );

    let mut md5_differs = 0;
    for id in &ids {
        let id = sid(id);
        assert_eq!(
            stored_hash(&store, &id.to_string()).await,
            i64::from(ex.hash(id))
        );
        md5_differs += usize::from(ex.of(id) != Partitioning::md5(8).of(id));
    }
    assert!(md5_differs > 0, "the test tells the two functions apart");
    for p in 0..8 {
        let mut want: Vec<SensorId> = ids
            .iter()
            .map(|s| sid(s))
            .filter(|&id| ex.of(id) == p)
            .collect();
        want.sort();
        assert_eq!(loaded(&store, p, 8).await, want, "partition {p}");
    }

    let c = store.db.unbounded().await.unwrap();
    let err = c
        .execute(
            "INSERT INTO sensors (id, address, created_at) VALUES ('nohash', 'here', 1)",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        crate::store::Error::from(err).to_string().contains("23502"),
        "NOT NULL refuses a sensor in no partition"
    );
}
