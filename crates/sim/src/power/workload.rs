//! The work the power is cut during: commits from one task (as the engine's committer makes
//! them), the archive's moves, delivery's claims and results beside it, retention rounds
//! and a backup between commits; and where in the record each began and ended, for the
//! cuts aimed at them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use latch::domain::{Event, EventKind, Millis, Outcome, SensorId, Verdict};
use latch::store::conformance::{client, sensor};
use latch::store::prelude::*;
use latch::store::sqlite::{SqliteStore, Tuning};
use latch::store::{CommitBatch, ReadingRecord, Retention, StateUpdate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{KEEP, MARKER, SENSORS, START, STEP, Settings, folder, vfs};

/// Each sensor's data and the device time of its last applied reading.
pub type States = std::collections::HashMap<SensorId, (Option<bool>, Option<Millis>)>;

/// One group commit the workload made.
pub struct Commit {
    pub readings: Vec<ReadingRecord>,
    /// The sensors whose state changed, at the commit's time.
    pub events: Vec<SensorId>,
    pub at: Millis,
    /// The notifications it made (when it was acknowledged).
    pub notifications: Vec<String>,
    /// Where the record stood once the store answered; `None`: it failed.
    pub acked: Option<usize>,
    /// Every sensor's state (data, last applied device time) after it.
    pub states: Arc<States>,
}

/// A retention round: where the record stood when it began, and its cut-offs.
pub struct Round {
    pub began: usize,
    pub ended: usize,
    pub history_before: Millis,
    pub notifications_before: Millis,
}

/// What the workload did, and where in the record.
pub struct Recorded {
    pub commits: Vec<Commit>,
    pub rounds: Vec<Round>,
    /// Readings moved into the archive.
    pub archived: usize,
    /// The store's first open (its files made, its schema migrated): ops `0..opened`.
    pub opened: usize,
    /// The backup's ops.
    pub backup: (usize, usize),
    /// The sensors, the marker last.
    pub ids: Vec<SensorId>,
}

/// One reading the workload sends: sensor, data, device time, receive time.
pub type Sent = (SensorId, bool, Millis, Millis);

/// Turns `sent` into a group commit at `at` as the engine would, from and into `states`:
/// a reading older than its sensor's last applied one is late and changes nothing; a
/// change of data is an event. Answers the batch and the sensors with an event.
pub fn batch(states: &mut States, sent: &[Sent], at: Millis) -> (CommitBatch, Vec<SensorId>) {
    let mut batch = CommitBatch::default();
    let mut touched: BTreeMap<SensorId, ()> = BTreeMap::new();
    let mut events = Vec::new();
    for &(id, data, ts, received_at) in sent {
        let (data_now, last_ts) = states.get(&id).copied().unwrap_or((None, None));
        let late = last_ts.is_some_and(|t| ts < t);
        batch.readings.push(ReadingRecord {
            sensor_id: id,
            data,
            ts,
            received_at,
            late,
            signals: Default::default(),
        });
        if late {
            continue;
        }
        states.insert(id, (Some(data), Some(ts)));
        touched.insert(id, ());
        if data_now != Some(data) && !events.contains(&id) {
            events.push(id);
        }
    }
    for id in touched.keys() {
        let (data, last_ts) = states[id];
        batch.states.push(StateUpdate {
            sensor_id: *id,
            data,
            changed_at: events.contains(id).then_some(at),
            last_ts,
            last_seen_at: Some(at),
            connection: latch::domain::Connection::Online,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        });
    }
    batch.events = events
        .iter()
        .map(|id| Event {
            sensor_id: *id,
            kind: EventKind::StateChanged,
            at,
            data: states[id].0,
            previous: None,
            last_seen_at: None,
            detail: Default::default(),
        })
        .collect();
    (batch, events)
}

/// Runs the workload in `dir` (see the module's documentation).
pub async fn workload(dir: &Path, settings: Settings) -> Recorded {
    let tuning = Tuning {
        checkpoint_pages: settings.checkpoint_pages,
    };
    let store =
        Arc::new(SqliteStore::open_tuned(dir, settings.sync, tuning).expect("the store opens"));
    let opened = vfs::mark();
    let mut ids: Vec<SensorId> = (0..SENSORS)
        .map(|i| SensorId::parse(&format!("s{i}")).expect("an id"))
        .collect();
    for c in ["c0", "c1"] {
        store
            .create_client(client(c, "http://127.0.0.1:9/"))
            .await
            .expect("a client");
    }
    for id in &ids {
        store
            .create_sensor(sensor(&id.to_string()))
            .await
            .expect("a sensor");
        for c in ["c0", "c1"] {
            store.link(c.into(), *id, START).await.expect("a link");
        }
    }
    let marker = SensorId::parse(MARKER).expect("an id");
    store.create_sensor(sensor(MARKER)).await.expect("a sensor");
    ids.push(marker);

    let stop = Arc::new(AtomicBool::new(false));
    let clock = Arc::new(AtomicI64::new(START));
    let archiver = tokio::spawn(archive(store.clone(), stop.clone()));
    let deliverer = tokio::spawn(deliver(store.clone(), clock.clone(), stop.clone()));

    let mut rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed);
    let mut states: States = ids.iter().map(|id| (*id, (None, None))).collect();
    let mut commits = Vec::new();
    let mut rounds = Vec::new();
    let mut backup = (0, 0);
    let mut tick: Millis = 0;
    for n in 0..settings.commits {
        let count = rng.gen_range(1..=12);
        let mut sent = Vec::new();
        for i in 0..=count {
            tick += 1;
            let now = START + tick * STEP;
            // The last reading of every commit is the marker's, at the commit's newest
            // time; the others go to random sensors, one in six late (a device time
            // before that sensor's last applied one). Each has a receive time of its own.
            if i == count {
                sent.push((marker, n % 2 == 0, now, now));
                continue;
            }
            let id = ids[rng.gen_range(0..SENSORS)];
            let late = rng.gen_ratio(1, 6);
            let ts = match states[&id].1 {
                Some(t) if late => t - 5,
                _ => now,
            };
            sent.push((id, rng.gen_bool(0.5), ts, now));
        }
        let at = START + tick * STEP;
        clock.store(at, Ordering::SeqCst);
        let (batch, events) = batch(&mut states, &sent, at);
        let result = store.commit(batch.clone(), at).await;
        let acked = result.is_ok().then(vfs::mark);
        commits.push(Commit {
            readings: batch.readings,
            events,
            at,
            notifications: result
                .map(|refs| refs.into_iter().map(|r| r.id).collect())
                .unwrap_or_default(),
            acked,
            states: Arc::new(states.clone()),
        });
        if n % 50 == 49 {
            let began = vfs::mark();
            let retention = Retention {
                history_before: Some(at - KEEP),
                notifications_before: Some(at - KEEP),
                audit_unshipped_kept: false,
            };
            store
                .maintain(at, retention)
                .await
                .expect("a retention round");
            rounds.push(Round {
                began,
                ended: vfs::mark(),
                history_before: at - KEEP,
                notifications_before: at - KEEP,
            });
        }
        if n == settings.commits / 2 {
            let began = vfs::mark();
            let (from, to) = (dir.to_path_buf(), folder());
            tokio::task::spawn_blocking(move || {
                latch::store::sqlite::backup(&from, &to.path().join("latch.backup"))
            })
            .await
            .expect("the backup ran")
            .expect("a backup");
            backup = (began, vfs::mark());
        }
    }
    stop.store(true, Ordering::SeqCst);
    let archived = archiver.await.expect("the archiver ends");
    deliverer.await.expect("delivery ends");
    Recorded {
        commits,
        rounds,
        archived,
        opened,
        backup,
        ids,
    }
}

/// Moves the journal into the archive a few hundred readings at a time, as the archiver
/// does every second; answers how many it moved.
async fn archive(store: Arc<SqliteStore>, stop: Arc<AtomicBool>) -> usize {
    let mut moved = 0;
    while !stop.load(Ordering::SeqCst) {
        moved += store.archive_history(300).await.expect("a move");
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    moved
}

/// Claims the heads of the lanes and records them delivered, as the dispatcher does.
async fn deliver(store: Arc<SqliteStore>, clock: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let now = clock.load(Ordering::SeqCst);
        deliver_once(&store, now).await.expect("a delivery round");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One round of delivery: the head of each lane claimed, and each claim it got recorded
/// delivered. Answers how many were delivered.
pub async fn deliver_once(store: &SqliteStore, now: Millis) -> latch::store::Result<usize> {
    let pending = store.load_pending(i64::MIN).await?;
    let mut heads: Vec<String> = Vec::new();
    let mut lanes = Vec::new();
    for n in pending {
        let lane = (n.client_id.clone(), n.sensor_id);
        if !lanes.contains(&lane) {
            lanes.push(lane);
            heads.push(n.id);
        }
    }
    let claims = store
        .claim(heads, "powercut".into(), now, now + 60_000, None)
        .await?;
    let outcomes: Vec<Outcome> = claims
        .into_iter()
        .filter_map(|c| match c {
            latch::domain::Claim::Send(s) => Some(Outcome {
                notification_id: s.notification.id.clone(),
                client_id: s.notification.client_id.clone(),
                attempt: Some(latch::domain::Attempt {
                    notification_id: s.notification.id.clone(),
                    at: now,
                    status_code: Some(204),
                    error: None,
                    duration_ms: 1,
                }),
                attempts: 1,
                verdict: Verdict::Delivered,
                node: "powercut".into(),
                batch_id: None,
            }),
            _ => None,
        })
        .collect();
    let delivered = outcomes.len();
    if !outcomes.is_empty() {
        store.record(outcomes, now, 86_400_000).await?;
    }
    Ok(delivered)
}
