//! The readings' journal and archive: a batch into the journal, moves into the archive
//! (in `archive.db`, or in `latch.db` for a folder made before), backups and restores.

use super::*;

/// A move into the archive copies, then deletes, in steps of their own: a reading in both
/// tables (a move under way, or cut short by a crash) is listed once, and the next move
/// takes it up again without failing on the copy already there.
#[tokio::test]
async fn a_reading_in_both_the_journal_and_the_archive_is_listed_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("both").unwrap();
    three_committed(&store, id).await;
    // Half a move: the first two copied, none deleted yet.
    store
        .write(|c| {
            c.execute(
                "INSERT INTO readings_archive (sensor_id, ts, id, received_at, data, late) \
                 SELECT sensor_id, ts, id, received_at, data, late FROM readings WHERE ts < 3000",
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000]);
    assert_eq!(store.archive_history(100).await.unwrap(), 3);
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000]);
    assert_eq!(
        rows_in(&store, "readings", "readings_archive").await,
        (0, 3)
    );
}

/// Sensor `id` registered, with three readings at 1000, 2000 and 3000 committed.
async fn three_committed(store: &SqliteStore, id: SensorId) {
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    let batch = CommitBatch {
        readings: [1000, 2000, 3000].map(|ts| reading(id, ts)).to_vec(),
        ..Default::default()
    };
    store.commit(batch, 3000).await.unwrap();
}

/// The three readings of [`three_committed`], moved into the archive.
async fn three_archived(store: &SqliteStore, id: SensorId) {
    three_committed(store, id).await;
    assert_eq!(store.archive_history(100).await.unwrap(), 3);
}

async fn listed(store: &SqliteStore, id: SensorId) -> Vec<i64> {
    let page = PageRequest {
        limit: 10,
        after: None,
    };
    let items = store
        .list_readings(id, TimeRange::default(), page)
        .await
        .unwrap()
        .items;
    items.iter().map(|r| r.row.ts).collect()
}

/// Archived readings in `file`'s own `readings_archive`, or `None` without that table.
fn archived_in(file: &std::path::Path) -> Option<i64> {
    let c = Connection::open(file).unwrap();
    c.query_row("SELECT COUNT(*) FROM main.readings_archive", [], |r| {
        r.get(0)
    })
    .ok()
}

/// A new data folder keeps its archive in `archive.db`, whose own writer takes the moves
/// off the one writer of `latch.db`.
#[tokio::test]
async fn a_new_data_folder_keeps_its_archive_in_a_file_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("own").unwrap();
    three_archived(&store, id).await;
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000]);
    drop(store);
    assert_eq!(archived_in(&dir.path().join("latch.db")), None);
    assert_eq!(archived_in(&dir.path().join("archive.db")), Some(3));
}

/// A data folder whose `latch.db` holds archived readings (made before the archive had a
/// file of its own) goes on with them there: read, and moved into, as before.
#[tokio::test]
async fn a_folder_with_its_archive_in_the_main_file_goes_on_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("legacy").unwrap();
    three_archived(&store, id).await;
    drop(store);
    // As such a folder is: the archive in latch.db, no archive.db.
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        archive::attach(&c, &dir.path().join("latch.db")).unwrap();
        c.execute_batch(
            "CREATE TABLE main.readings_archive (sensor_id TEXT NOT NULL, ts INTEGER NOT NULL, \
               id INTEGER NOT NULL, received_at INTEGER NOT NULL, data INTEGER NOT NULL, \
               late INTEGER NOT NULL, PRIMARY KEY (sensor_id, ts, id)) WITHOUT ROWID;
             INSERT INTO main.readings_archive SELECT sensor_id, ts, id, received_at, data, \
               late FROM archive.readings_archive;",
        )
        .unwrap();
    }
    archive::remove(&dir.path().join("latch.db")).unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000]);
    let more = CommitBatch {
        readings: vec![reading(id, 4000)],
        ..Default::default()
    };
    store.commit(more, 4000).await.unwrap();
    assert_eq!(store.archive_history(100).await.unwrap(), 1);
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000, 4000]);
    drop(store);
    assert_eq!(archived_in(&dir.path().join("latch.db")), Some(4));
    assert!(!dir.path().join("archive.db").exists());
}

/// A backup is one file with the archive in it; a restore puts the archive back into a file
/// of its own, in place of the folder's earlier one.
#[tokio::test]
async fn a_backup_holds_the_archive_and_a_restore_splits_it_off_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("kept").unwrap();
    three_archived(&store, id).await;
    let file = dir.path().join("backup.db");
    backup(dir.path(), &file).unwrap();
    drop(store);
    assert_eq!(archived_in(&file), Some(3));

    // Restored over another folder, whose own archive goes.
    let other = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(other.path(), Synchronous::Normal).unwrap();
    three_archived(&store, SensorId::parse("gone").unwrap()).await;
    drop(store);
    // A backup is restored with its key (the book: backup and restore): it does not hold it, and a
    // restore without it is refused.
    let key = crate::secrets::KEY_FILE;
    let keys =
        || crate::secrets::Keyring::new(crate::secrets::Source::File(other.path().join(key)));
    let e = restore(other.path(), &file, &keys())
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing restored"), "{e}");
    std::fs::copy(dir.path().join(key), other.path().join(key)).unwrap();
    restore(other.path(), &file, &keys()).unwrap();
    assert_eq!(archived_in(&other.path().join("latch.db")), None);
    assert_eq!(archived_in(&other.path().join("archive.db")), Some(3));
    let store = SqliteStore::open(other.path(), Synchronous::Normal).unwrap();
    assert_eq!(listed(&store, id).await, vec![1000, 2000, 3000]);
    assert!(
        listed(&store, SensorId::parse("gone").unwrap())
            .await
            .is_empty()
    );
}

/// A folder whose `latch.db` records its archive file, without the file (lost, or left
/// out of a copy), is refused with what to do, not opened with an empty archive; removing
/// the record is the way to go on without the archived readings.
#[tokio::test]
async fn a_folder_that_lost_its_archive_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("lost").unwrap();
    three_archived(&store, id).await;
    drop(store);
    archive::remove(&dir.path().join("latch.db")).unwrap();
    let refused = SqliteStore::open(dir.path(), Synchronous::Normal)
        .err()
        .expect("refused");
    assert!(
        format!("{refused:#}").contains("archive.db is missing"),
        "{refused:#}"
    );
    assert!(!dir.path().join("archive.db").exists(), "nothing made");
    let c = Connection::open(dir.path().join("latch.db")).unwrap();
    c.execute("DELETE FROM archive_made", []).unwrap();
    drop(c);
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    assert!(listed(&store, id).await.is_empty());
}

/// With `synchronous = normal`, a power cut may take `latch.db`'s last commits after the
/// archive's writer (which syncs) copied their readings; the readings' id counter goes back
/// with them. An id handed out again met the archive's copy (same sensor, time and id):
/// the new reading was dropped by the move and hidden by reads (the power-cut test). At
/// open, the counter is raised past every id the archive holds.
#[tokio::test]
async fn a_reading_id_the_archive_holds_is_never_handed_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("again").unwrap();
    three_archived(&store, id).await;
    drop(store);
    // As the cut leaves it: the commits that made ids 1 to 3 lost, their readings archived.
    let c = Connection::open(dir.path().join("latch.db")).unwrap();
    c.execute(
        "UPDATE sqlite_sequence SET seq = 0 WHERE name = 'readings'",
        [],
    )
    .unwrap();
    drop(c);
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    // The device sends the lost reading at 1000 again, received later.
    let again = ReadingRecord {
        received_at: 5000,
        ..reading(id, 1000)
    };
    let batch = CommitBatch {
        readings: vec![again],
        ..Default::default()
    };
    store.commit(batch, 5000).await.unwrap();
    assert_eq!(store.archive_history(100).await.unwrap(), 1);
    let page = PageRequest {
        limit: 10,
        after: None,
    };
    let received: Vec<i64> = store
        .list_readings(id, TimeRange::default(), page)
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.row.received_at)
        .collect();
    assert_eq!(received, vec![1000, 5000, 2000, 3000]);
}

/// A batch of more readings than one `INSERT` writes: every reading of a registered sensor
/// is in the journal once, with its values, ids ascending in the batch's order, and those
/// of a sensor not registered are not.
#[tokio::test]
async fn a_large_batch_journals_every_reading_in_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    let (a, b) = (
        SensorId::parse("big1").unwrap(),
        SensorId::parse("big2").unwrap(),
    );
    let unknown = SensorId::parse("nobody").unwrap();
    for id in [a, b] {
        store
            .create_sensor(conformance::sensor(&id.to_string()))
            .await
            .unwrap();
    }
    // 2 × 64 + 7 of the registered two, an unknown sensor's every fifth.
    let readings: Vec<ReadingRecord> = (0..169)
        .map(|i| {
            let id = match i % 5 {
                4 => unknown,
                k if k % 2 == 0 => a,
                _ => b,
            };
            ReadingRecord {
                late: i % 7 == 0,
                received_at: 10_000 + i,
                ..reading(id, 1_000 + i)
            }
        })
        .collect();
    let batch = CommitBatch {
        readings: readings.clone(),
        ..Default::default()
    };
    store.commit(batch, 20_000).await.unwrap();
    let journal: Vec<(String, i64, i64, bool, bool)> =
        Connection::open(dir.path().join("latch.db"))
            .unwrap()
            .prepare("SELECT sensor_id, ts, received_at, data, late FROM readings ORDER BY id")
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
    let expected: Vec<(String, i64, i64, bool, bool)> = readings
        .iter()
        .filter(|r| r.sensor_id != unknown)
        .map(|r| {
            let id = r.sensor_id.to_string();
            (id, r.ts, r.received_at, r.data, r.late)
        })
        .collect();
    assert_eq!(expected.len(), 136);
    assert_eq!(journal, expected);
}

/// Events land in a journal of their own and a move takes them into `events` (migration
/// 0020): a sensor's events are listed once and in time order before and after the move,
/// also a page at a time across the two tables; they keep their ids; and the ids of new
/// ones go on above those moved, though the journal is empty by then.
#[tokio::test]
async fn events_moved_out_of_their_journal_keep_their_ids_and_are_listed_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let (a, b) = (
        SensorId::parse("evA").unwrap(),
        SensorId::parse("evB").unwrap(),
    );
    for id in [a, b] {
        store
            .create_sensor(conformance::sensor(&id.to_string()))
            .await
            .unwrap();
    }
    // Four changes from `from` on, a millisecond apart, the sensors taking turns.
    let changes = |from: i64| CommitBatch {
        events: (0..4)
            .map(|i| Event {
                sensor_id: if i % 2 == 0 { a } else { b },
                kind: EventKind::StateChanged,
                at: from + i,
                data: Some(i % 4 == 0),
                previous: Some(i % 4 != 0),
                last_seen_at: Some(from + i),
                detail: Default::default(),
            })
            .collect(),
        ..Default::default()
    };
    store.commit(changes(1000), 2000).await.unwrap();
    let first = events_of(&store, a, 10).await;
    assert_eq!(times(&first), vec![1000, 1002]);
    store.archive_history(100).await.unwrap();
    assert_eq!(
        rows_in(&store, "events", "events_journal").await,
        (4, 0),
        "all moved"
    );
    assert_eq!(
        events_of(&store, a, 10).await,
        first,
        "the same ids, listed once"
    );
    store.commit(changes(3000), 4000).await.unwrap();
    assert_eq!(rows_in(&store, "events", "events_journal").await, (4, 4));
    let all = events_of(&store, a, 10).await;
    assert_eq!(times(&all), vec![1000, 1002, 3000, 3002]);
    assert_eq!(all[..2], first[..]);
    let moved_max = store
        .read(|c| Ok(c.query_row("SELECT max(id) FROM events", [], |r| r.get::<_, i64>(0))?))
        .await
        .unwrap();
    assert!(all[2].0 > moved_max, "new ids go on above the moved ones");
    assert_eq!(events_of(&store, a, 1).await, all, "a page at a time");
    store.archive_history(100).await.unwrap();
    assert_eq!(rows_in(&store, "events", "events_journal").await, (8, 0));
    assert_eq!(events_of(&store, a, 1).await, all);
}

fn times(events: &[(i64, i64)]) -> Vec<i64> {
    events.iter().map(|e| e.1).collect()
}

/// How many rows tables `a` and `b` hold.
async fn rows_in(store: &SqliteStore, a: &'static str, b: &'static str) -> (i64, i64) {
    store
        .read(move |c| {
            Ok(c.query_row(
                &format!("SELECT (SELECT COUNT(*) FROM {a}), (SELECT COUNT(*) FROM {b})"),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?)
        })
        .await
        .unwrap()
}
