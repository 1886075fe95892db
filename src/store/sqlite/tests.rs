//! Tests of what is particular to the SQLite store; the conformance suite covers the rest.

use crate::store::prelude::*;
use rusqlite::Connection;

use super::*;
use crate::domain::{Connection as Conn, Event, EventKind, Notification, Sensor, SensorId};
use crate::store::conformance;
use crate::store::{
    Claim, CommitBatch, NotificationFilter, Page, PageRequest, ReadingRecord, TimeRange,
};

/// Claims skip the wait for the disk (a lost lease only means sending again), and the
/// commit after one is back at the configured durability: triggers record
/// `PRAGMA synchronous` as the claim's lease update and the next commit's state upsert run.
#[tokio::test]
async fn claims_skip_the_disk_wait_and_commits_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    let id = SensorId::parse("durable").unwrap();
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    store
        .create_client(conformance::client("c", "http://127.0.0.1:9/"))
        .await
        .unwrap();
    store.link("c".into(), id, 1).await.unwrap();
    let batch = |at: i64, data: bool| CommitBatch {
        readings: vec![],
        states: vec![crate::store::StateUpdate {
            sensor_id: id,
            data: Some(data),
            changed_at: Some(at),
            last_ts: Some(at),
            last_seen_at: Some(at),
            connection: Conn::Online,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        }],
        events: vec![Event {
            sensor_id: id,
            kind: EventKind::StateChanged,
            at,
            data: Some(data),
            previous: None,
            last_seen_at: None,
            detail: Default::default(),
        }],
        ..Default::default()
    };
    let n = store.commit(batch(1, true), 1).await.unwrap().remove(0);
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        c.execute_batch(
            "CREATE TABLE probe (what TEXT, synchronous INTEGER);
             CREATE TRIGGER probe_claim AFTER UPDATE OF lease_until ON notifications BEGIN
               INSERT INTO probe SELECT 'claim', synchronous FROM pragma_synchronous;
             END;
             CREATE TRIGGER probe_commit AFTER UPDATE ON sensor_state BEGIN
               INSERT INTO probe SELECT 'commit', synchronous FROM pragma_synchronous;
             END;",
        )
        .unwrap();
    }
    let claimed = store
        .claim(vec![n.id.clone()], "node".into(), 2, 10_000, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)), "{claimed:?}");
    store.commit(batch(3, false), 3).await.unwrap();
    let seen: Vec<(String, i64)> = store
        .write(|c| {
            let mut s = c.prepare("SELECT what, synchronous FROM probe ORDER BY rowid")?;
            let seen = s
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(seen)
        })
        .await
        .unwrap();
    assert_eq!(
        seen,
        vec![("claim".to_string(), 1), ("commit".to_string(), 2)],
        "PRAGMA synchronous of the writer (NORMAL = 1, FULL = 2)"
    );
}

#[test]
fn a_data_folder_serves_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let _first = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let err = SqliteStore::open(dir.path(), Synchronous::Normal)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("in use by another latch"), "{err}");
}

#[test]
fn a_data_folder_a_newer_latch_wrote_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path(), Synchronous::Normal).unwrap());
    let newer = MIGRATIONS.len() + 1;
    let db = Connection::open(dir.path().join("latch.db")).unwrap();
    db.pragma_update(None, "user_version", newer).unwrap();
    drop(db);
    let err = SqliteStore::open(dir.path(), Synchronous::Normal)
        .err()
        .expect("a newer schema is refused")
        .to_string();
    assert!(err.contains("newer than this latch"), "{err}");
    let db = Connection::open(dir.path().join("latch.db")).unwrap();
    let version: usize = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, newer, "the refused folder keeps its version");
}

#[tokio::test]
async fn data_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let id = SensorId::parse("keep").unwrap();
    {
        let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
        store
            .create_sensor(Sensor {
                id,
                address: "here".into(),
                heartbeat_timeout_s: Some(5),
                debounce_s: None,
                site_id: None,
                created_at: 1,
                battery_low_pct: crate::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                labels: Default::default(),
                hold_alarms: Default::default(),
                flap: None,
                armed: None,
            })
            .await
            .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
    let (s, _) = store.get_sensor(id).await.unwrap().unwrap();
    assert_eq!(
        (s.address.as_str(), s.heartbeat_timeout_s),
        ("here", Some(5))
    );
}

#[tokio::test]
async fn a_version_1_database_keeps_its_history_through_the_migrations() {
    let dir = tempfile::tempdir().unwrap();
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        c.execute_batch(MIGRATIONS[0]).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
        c.execute_batch(
            "INSERT INTO sensors VALUES ('old', 'here', NULL, 1);
             INSERT INTO readings (id, sensor_id, ts, received_at, data, late)
               VALUES (7, 'old', 1000, 1000, 1, 0), (8, 'old', 2000, 2000, 0, 0);
             INSERT INTO events (id, sensor_id, kind, at, data, previous, last_seen_at)
               VALUES (3, 'old', 'sensor.state_changed', 2000, 0, 1, NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("old").unwrap();
    let all = |store: SqliteStore| async move {
        store
            .list_readings(
                id,
                TimeRange::default(),
                PageRequest {
                    limit: 10,
                    after: None,
                },
            )
            .await
            .unwrap()
            .items
    };
    let kept = all(store.clone()).await;
    assert_eq!(kept.iter().map(|r| r.id).collect::<Vec<_>>(), vec![7, 8]);
    assert_eq!(
        store.spool_depth().await.unwrap(),
        1,
        "old readings moved to the archive at the upgrade (the event stays)"
    );
    assert_eq!(events_of(&store, id, 10).await[0].0, 3);
    // New rows continue after the old ids (an event's too, from its journal), and moving
    // to the archive changes nothing.
    let batch = CommitBatch {
        readings: vec![reading(id, 3000)],
        events: vec![Event {
            sensor_id: id,
            kind: EventKind::StateChanged,
            at: 3000,
            data: Some(true),
            previous: Some(false),
            last_seen_at: Some(3000),
            detail: Default::default(),
        }],
        ..Default::default()
    };
    store.commit(batch, 3000).await.unwrap();
    store.archive_history(100).await.unwrap();
    let ids: Vec<i64> = events_of(&store, id, 10)
        .await
        .iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids[0] == 3 && ids[1] > 3, "{ids:?}");
    let after = all(store).await;
    assert_eq!(
        after.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
}

/// SQLite has no leases to check a fence against, so a fenced batch is refused whole.
#[tokio::test]
async fn a_fenced_batch_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("nofence").unwrap();
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    let batch = CommitBatch {
        readings: vec![ReadingRecord {
            sensor_id: id,
            data: true,
            ts: 1,
            received_at: 1,
            late: false,
            signals: Default::default(),
        }],
        fence: vec![crate::store::Fence {
            partition: 0,
            epoch: 1,
        }],
        ..Default::default()
    };
    let err = store.commit(batch, 1).await.unwrap_err().to_string();
    assert!(err.contains("needs PostgreSQL"), "{err}");
    let readings = store
        .list_readings(
            id,
            TimeRange::default(),
            PageRequest {
                limit: 10,
                after: None,
            },
        )
        .await
        .unwrap();
    assert!(readings.items.is_empty());
}

/// At the upgrade to the ship mark, the attempts that had not reached ClickHouse still wait
/// and those that had do not go again; once shipped, nothing waits. (New attempts shipping
/// past the mark: the conformance suite's spool check.)
#[tokio::test]
async fn attempts_unshipped_before_the_upgrade_still_ship_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        for sql in &MIGRATIONS[..6] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", 6).unwrap();
        c.execute_batch(
            "INSERT INTO attempts (id, notification_id, at, status_code, error, duration_ms, shipped)
               VALUES (1, 'n1', 10, 500, NULL, 3, 1), (2, 'n1', 20, 500, NULL, 3, 1),
                      (3, 'n1', 30, 500, NULL, 3, 0), (4, 'n1', 40, 200, NULL, 3, 0);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    assert_eq!(store.spool_depth().await.unwrap(), 2);
    let sink = conformance::Collect::default();
    assert_eq!(store.ship_history(100, &sink).await.unwrap(), 2);
    assert_eq!(store.ship_history(100, &sink).await.unwrap(), 0);
    let shipped: Vec<i64> = sink
        .got
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b.attempts.iter().map(|a| a.id))
        .collect();
    assert_eq!(shipped, vec![3, 4]);
    assert_eq!(store.spool_depth().await.unwrap(), 0);
    let index: Option<String> = store
        .read(|c| {
            Ok(c.query_row(
                "SELECT name FROM sqlite_master WHERE name = 'attempts_unshipped'",
                [],
                |r| r.get(0),
            )
            .ok())
        })
        .await
        .unwrap();
    assert_eq!(index, None, "no index of unshipped attempts is kept");
}

/// A folder whose attempts had all been shipped and then deleted by retention before the
/// upgrade to ids that are never reused: the next attempt gets an id above the ship mark,
/// so it waits in the spool, and the attempts kept keep their ids.
#[tokio::test]
async fn after_the_upgrade_no_attempt_id_is_at_or_below_the_ship_mark() {
    let dir = tempfile::tempdir().unwrap();
    let upgraded = MIGRATIONS
        .iter()
        .position(|m| m.contains("attempts_next"))
        .expect("the migration that makes attempt ids unique");
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        for sql in &MIGRATIONS[..upgraded] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", upgraded).unwrap();
        // Seven attempts made, shipped (the mark at 7), then deleted but the oldest two,
        // whose notification is still pending.
        c.execute_batch(
            "INSERT INTO attempts (id, notification_id, at, status_code, error, duration_ms)
               VALUES (1, 'n1', 10, 500, NULL, 3), (2, 'n1', 20, 500, NULL, 3);
             UPDATE ship_marks SET last_id = 7 WHERE what = 'attempts';",
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    assert_eq!(store.spool_depth().await.unwrap(), 0);
    let ids = |c: &Connection| -> Result<Vec<i64>> {
        Ok(c.prepare("SELECT id FROM attempts ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    };
    assert_eq!(store.read(ids).await.unwrap(), [1, 2]);
    store
        .write(|c| {
            c.execute(
                "INSERT INTO attempts (notification_id, at, status_code, error, duration_ms)
                 VALUES ('n1', 30, 200, NULL, 3)",
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(store.read(ids).await.unwrap(), [1, 2, 8]);
    assert_eq!(
        store.spool_depth().await.unwrap(),
        1,
        "the new attempt waits"
    );
}

/// At the upgrade to the clients' running health summary, what health said before it says
/// after: the summary is filled from the attempts, and the last hour's attempts carry
/// their client.
#[tokio::test]
async fn client_health_reads_the_same_across_the_upgrade_to_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let now = crate::domain::time::now_ms();
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        for sql in &MIGRATIONS[..8] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", 8).unwrap();
        c.execute_batch(&format!(
            "INSERT INTO clients (id, name, url, secret, created_at)
               VALUES ('c1', 'c', 'http://c/', 's', 1), ('c2', 'd', 'http://d/', 's', 1);
             INSERT INTO notifications (id, client_id, sensor_id, kind, occurred_at, status,
               created_at, updated_at)
               VALUES ('n1', 'c1', 's1', 'sensor.state_changed', 1, 'failed', 1, 1),
                      ('n2', 'c1', 's1', 'sensor.state_changed', 1, 'delivered', 1, 1);
             INSERT INTO attempts (notification_id, at, status_code, error, duration_ms)
               VALUES ('n2', 1000, 200, NULL, 5), ('n1', 2000, 500, 'status 500', 7),
                      ('n1', {a}, NULL, 'connection refused', 9), ('n2', {b}, 204, NULL, 4);",
            a = now - 60_000,
            b = now - 30_000,
        ))
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let h = store
        .client_health("c1".into(), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h.last_success_at, Some(now - 30_000));
    assert_eq!(h.last_failure_at, Some(now - 60_000));
    assert_eq!(h.last_error.as_deref(), Some("connection refused"));
    assert_eq!(h.consecutive_failures, 0);
    assert_eq!(
        h.success_ratio_1h,
        Some(0.5),
        "the last hour's two attempts"
    );
    assert_eq!((h.pending, h.failed), (0, 1));
    let idle = store
        .client_health("c2".into(), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((idle.last_success_at, idle.consecutive_failures), (None, 0));
}

/// The write-ahead log is checkpointed beside the writer and starts over: it does not grow
/// with what is written, though no commit checkpoints it.
#[tokio::test]
async fn the_write_ahead_log_is_checkpointed_beside_the_writer_and_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("wal").unwrap();
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    // ~100 MiB of readings (2.5 times the log's checkpoint size) in commits of 25,000.
    let mut ts = 0;
    for _ in 0..100 {
        let readings = (0..25_000)
            .map(|_| {
                ts += 1;
                reading(id, ts)
            })
            .collect();
        let batch = CommitBatch {
            readings,
            ..Default::default()
        };
        store.commit(batch, ts).await.unwrap();
    }
    let wal = std::fs::metadata(dir.path().join("latch.db-wal"))
        .unwrap()
        .len();
    let db = std::fs::metadata(dir.path().join("latch.db"))
        .unwrap()
        .len();
    // Only a checkpoint writes to the database file; a log that never started over would
    // hold all ~100 MiB.
    assert!(
        db > 30 << 20,
        "readings reached the database file: {db} bytes"
    );
    assert!(wal < 80 << 20, "the log started over: {wal} bytes");
}

/// A log that grew while a reader kept it from starting over (retention reading the archive
/// while it deletes there, say) is cut back to its checkpoint size once it starts over,
/// rather than keeping for good the most it ever held.
#[tokio::test]
async fn a_log_that_grew_past_its_checkpoints_is_cut_back_once_it_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let id = SensorId::parse("cut").unwrap();
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    let log = dir.path().join("archive.db-wal");
    let size = || std::fs::metadata(&log).map_or(0, |m| m.len() as i64);
    let mut ts = 0;
    let mut moves = |n: usize| {
        let store = store.clone();
        let mut batches = Vec::new();
        for _ in 0..n {
            let readings: Vec<_> = (0..25_000)
                .map(|_| {
                    ts += 1;
                    reading(id, ts)
                })
                .collect();
            batches.push((readings, ts));
        }
        async move {
            for (readings, at) in batches {
                let batch = CommitBatch {
                    readings,
                    ..Default::default()
                };
                store.commit(batch, at).await.unwrap();
                assert_eq!(store.archive_history(25_000).await.unwrap(), 25_000);
            }
        }
    };
    // A reader of the archive keeps its snapshot: no checkpoint can finish meanwhile.
    let reader = Connection::open(dir.path().join("archive.db")).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM readings_archive", [], |r| r.get(0))
        .unwrap();
    moves(8).await;
    let grown = size();
    let limit = LOG_LIMITS[1].1;
    assert!(grown > limit, "the log grew past its limit: {grown} bytes");
    reader.execute_batch("COMMIT").unwrap();
    // The next moves checkpoint it, start it over, and cut the file back.
    moves(3).await;
    let cut = size();
    assert!(
        cut < grown && cut <= limit + (1 << 20),
        "the log was cut back from {grown} to {cut} bytes (limit {limit})"
    );
}

/// Sensor `id`'s events as (id, at), listed `limit` a page.
async fn events_of(store: &SqliteStore, id: SensorId, limit: u32) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_events(id, TimeRange::default(), PageRequest { limit, after })
            .await
            .unwrap();
        out.extend(page.items.iter().map(|e| (e.id, e.row.at)));
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

/// A reading of `id` at `ts` (received then), its data alternating with the second.
fn reading(id: SensorId, ts: i64) -> ReadingRecord {
    ReadingRecord {
        sensor_id: id,
        data: ts % 2 == 0,
        ts,
        received_at: ts,
        late: false,
        signals: Default::default(),
    }
}

mod journal;
mod plans;
mod threads;

/// Issue #70: at the upgrade that keeps the sensors a site notification names, those made
/// before it are found from each sensor they named too.
#[tokio::test]
async fn site_notifications_made_before_the_upgrade_are_found_from_their_sensors() {
    let dir = tempfile::tempdir().unwrap();
    let before = MIGRATIONS
        .iter()
        .position(|m| m.contains("CREATE TABLE notification_sensors"))
        .unwrap();
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        for sql in &MIGRATIONS[..before] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", before).unwrap();
        c.execute_batch(
            r#"INSERT INTO notifications (id, client_id, sensor_id, kind, occurred_at, status,
                 created_at, updated_at, body, site_id)
               VALUES ('n1', 'c1', 'up1', 'site.connection_restored', 1, 'delivered', 1, 1,
                 '{"site":{"id":"b"},"restored":[{"id":"up1","data":1}],"still_lost":[{"id":"up2"}]}',
                 'b'),
                 ('n2', 'c1', 'up2', 'sensor.state_changed', 1, 'delivered', 1, 1, NULL, NULL);"#,
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let of = |s: &str| NotificationFilter {
        sensor_id: Some(SensorId::parse(s).unwrap()),
        ..Default::default()
    };
    let page = || PageRequest {
        limit: 10,
        after: None,
    };
    let ids = |p: Page<Notification>| p.items.into_iter().map(|n| n.id).collect::<Vec<_>>();
    let got = store.list_notifications(of("up2"), page()).await.unwrap();
    assert_eq!(ids(got), ["n1", "n2"]);
    let got = store.list_notifications(of("up1"), page()).await.unwrap();
    assert_eq!(ids(got), ["n1"]);
}

/// Silences made before their sensors had a table of their own answer the same after the
/// upgrade: the sensors as given (one twice), none for one that named none.
#[tokio::test]
async fn silences_keep_their_sensors_through_the_upgrade() {
    use crate::store::Silences;
    let dir = tempfile::tempdir().unwrap();
    let upgraded = MIGRATIONS
        .iter()
        .position(|m| m.contains("CREATE TABLE silence_sensors"))
        .expect("the migration that gives silences' sensors a table");
    {
        let c = Connection::open(dir.path().join("latch.db")).unwrap();
        for sql in &MIGRATIONS[..upgraded] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", upgraded).unwrap();
        c.execute_batch(
            "INSERT INTO silences (id, site_id, sensor_ids, client_id, types, starts_at,
               ends_at, comment, created_at, updated_at)
             VALUES ('q1', NULL, ',b1,a1,b1,', NULL, NULL, 1, 2, 'x', 1, 1),
                    ('q2', NULL, NULL, 'c1', NULL, 1, 2, 'x', 1, 1);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let ids = ["b1", "a1", "b1"]
        .map(|i| SensorId::parse(i).unwrap())
        .to_vec();
    let q1 = store.get_silence("q1".into()).await.unwrap().unwrap();
    assert_eq!(q1.matcher.sensor_ids, Some(ids));
    let q2 = store.get_silence("q2".into()).await.unwrap().unwrap();
    assert_eq!(q2.matcher.sensor_ids, None);
    assert_eq!(q2.matcher.client_id.as_deref(), Some("c1"));
}
