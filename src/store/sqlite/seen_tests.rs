//! The times kept between flushes: read as committed, written at most once a second, and
//! taken back from the journal after a crash.

use rusqlite::Connection;

use super::super::{SqliteStore, Synchronous};
use crate::domain::{Connection as Conn, Millis, SensorId};
use crate::store::conformance;
use crate::store::prelude::*;
use crate::store::{CommitBatch, PageRequest, ReadingRecord, StateUpdate};

/// The sensor's state after a reading at `ts` received at `seen` (late when `late`, so
/// its `last_ts` stays `last_ts`), as the engine commits it.
fn batch(id: SensorId, last_ts: Millis, ts: Millis, seen: Millis, late: bool) -> CommitBatch {
    CommitBatch {
        readings: vec![ReadingRecord {
            sensor_id: id,
            data: true,
            ts,
            received_at: seen,
            late,
            signals: Default::default(),
        }],
        states: vec![StateUpdate {
            sensor_id: id,
            data: Some(true),
            changed_at: None,
            last_ts: Some(last_ts),
            last_seen_at: Some(seen),
            connection: Conn::Online,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: true,
        }],
        ..Default::default()
    }
}

/// A registered sensor `id` whose first reading (ts and arrival 1,000) is committed.
async fn first_reading(store: &SqliteStore, id: SensorId) {
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    let mut first = batch(id, 1_000, 1_000, 1_000, false);
    first.states[0].seen_only = false;
    first.states[0].changed_at = Some(1_000);
    store.commit(first, 1_000).await.unwrap();
}

/// `sensor_state`'s row as the file holds it, read past the store.
fn row(dir: &std::path::Path, id: SensorId) -> (Option<Millis>, Option<Millis>) {
    Connection::open(dir.join("latch.db"))
        .unwrap()
        .query_row(
            "SELECT last_ts, last_seen_at FROM sensor_state WHERE sensor_id = ?1",
            [id.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// What every read of the store shows of the sensor: its status's `last_seen_at`, and
/// the engine's `last_ts` and `last_seen_at`.
async fn shown(store: &SqliteStore, id: SensorId) -> (Option<Millis>, Option<Millis>) {
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    let listed = store
        .list_sensors(
            crate::store::SensorFilter::default(),
            PageRequest {
                limit: 100,
                after: None,
            },
        )
        .await
        .unwrap();
    let (_, in_list) = listed.items.iter().find(|(s, _)| s.id == id).unwrap();
    assert_eq!(in_list.last_seen_at, status.last_seen_at, "list as get");
    let (_, state) = store.load_states(vec![id]).await.unwrap().remove(0);
    let all = store.load_runtime().await.unwrap();
    let (_, at_start) = all.iter().find(|(s, _)| *s == id).unwrap();
    assert_eq!(
        (at_start.last_ts, at_start.last_seen_at),
        (state.last_ts, state.last_seen_at),
        "runtime as states"
    );
    assert_eq!(status.last_seen_at, state.last_seen_at, "status as state");
    (state.last_ts, state.last_seen_at)
}

#[tokio::test]
async fn times_a_commit_keeps_are_read_at_once_and_taken_back_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let id = SensorId::parse("seen1").unwrap();
    {
        let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
        first_reading(&store, id).await;
        store
            .commit(batch(id, 2_000, 2_000, 2_500, false), 2_500)
            .await
            .unwrap();
        // A late reading: seen again, its device time not taken.
        store
            .commit(batch(id, 2_000, 1_500, 3_000, true), 3_000)
            .await
            .unwrap();
        assert_eq!(row(dir.path(), id), (Some(1_000), Some(1_000)), "kept");
        assert_eq!(shown(&store, id).await, (Some(2_000), Some(3_000)));
        // The first reading, written whole, may leave the journal; those kept may not.
        assert_eq!(store.archive_history(100).await.unwrap(), 1);
        // Dropped without a stop: what a `kill -9` leaves.
    }
    assert_eq!(row(dir.path(), id), (Some(1_000), Some(1_000)));
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    assert_eq!(row(dir.path(), id), (Some(2_000), Some(3_000)), "replayed");
    assert_eq!(shown(&store, id).await, (Some(2_000), Some(3_000)));
}

#[tokio::test]
async fn kept_times_are_written_a_second_later_and_the_journal_then_moves() {
    let dir = tempfile::tempdir().unwrap();
    let id = SensorId::parse("seen2").unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    first_reading(&store, id).await;
    store
        .commit(batch(id, 2_000, 2_000, 2_000, false), 2_000)
        .await
        .unwrap();
    assert_eq!(row(dir.path(), id), (Some(1_000), Some(1_000)));
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    // The next commit flushes what was kept, its own update with it.
    store
        .commit(batch(id, 3_000, 3_000, 3_000, false), 3_000)
        .await
        .unwrap();
    assert_eq!(row(dir.path(), id), (Some(3_000), Some(3_000)), "flushed");
    assert_eq!(store.archive_history(100).await.unwrap(), 3, "all moved");
    store
        .commit(batch(id, 4_000, 4_000, 4_000, false), 4_000)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    // With no commit, the archive's move flushes first.
    assert_eq!(store.archive_history(100).await.unwrap(), 1);
    assert_eq!(row(dir.path(), id), (Some(4_000), Some(4_000)));
    assert_eq!(shown(&store, id).await, (Some(4_000), Some(4_000)));
}

#[tokio::test]
async fn a_sensor_deleted_and_made_again_keeps_nothing_of_its_times() {
    let dir = tempfile::tempdir().unwrap();
    let id = SensorId::parse("seen3").unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    first_reading(&store, id).await;
    store
        .commit(batch(id, 2_000, 2_000, 2_000, false), 2_000)
        .await
        .unwrap();
    assert!(store.delete_sensor(id, 2_100).await.unwrap());
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    assert_eq!((status.data, status.last_seen_at), (None, None));
    // A kept update of a sensor without a state row is not kept: it is written whole,
    // as any first state (here: no row, as the sensor has none).
    store
        .commit(batch(id, 3_000, 3_000, 3_000, false), 3_000)
        .await
        .unwrap();
    assert_eq!(row(dir.path(), id), (Some(3_000), Some(3_000)));
}
