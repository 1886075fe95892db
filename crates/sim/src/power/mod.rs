//! Power cuts of the embedded store (issue #48, part 2).
//!
//! The real SQLite store runs a real mix of work — group commits of readings, state and
//! notifications, moves of the journal into the archive (its own file, with its own
//! writer), claims and recorded attempts, retention rounds, a backup, and the write-ahead
//! logs' checkpoints beside them — through a VFS that records every write and sync of
//! each file ([`vfs`]). Then, at many points of that record, the data folder is rebuilt as
//! a disk could hold it had the power gone then ([`disk`]): what was synced is there, of
//! the rest any part or none, writes torn at sector edges. The store is opened on each
//! rebuilt folder, as a restart would, and checked:
//!
//! - it opens, and both files pass SQLite's integrity check;
//! - the commits it holds are a prefix of those made, each whole: every reading, event and
//!   notification of a commit in it is there, once, and none of a commit after it (only
//!   what a retention round already begun may have deleted is missing);
//! - each sensor's state is the one the readings of that prefix give;
//! - with `synchronous = full`, the prefix holds every commit acknowledged before the cut:
//!   nothing answered 202 is lost. With `normal`, the README's promise: a power cut may
//!   lose the last commits, never more than a tail of them.

pub mod disk;
pub mod vfs;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use latch::config::Synchronous;
use latch::domain::{Event, EventKind, Millis, Outcome, SensorId, Verdict};
use latch::store::conformance::{client, sensor};
use latch::store::prelude::*;
use latch::store::sqlite::{SqliteStore, Tuning};
use latch::store::{
    CommitBatch, NotificationFilter, PageRequest, ReadingRecord, Retention, StateUpdate, TimeRange,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where the workload's clock starts.
const START: Millis = 1_900_000_000_000;
/// Sensors the readings go to, besides the marker.
const SENSORS: usize = 24;
/// The sensor every commit writes one reading of, in order: which commits a rebuilt store
/// holds is read from its readings.
const MARKER: &str = "marker";
/// Readings a retention round keeps: those of about the last this many commits.
const KEEP: Millis = 40 * STEP;
/// Clock time between two readings.
const STEP: Millis = 10;

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub sync: Synchronous,
    /// Group commits the workload makes.
    pub commits: usize,
    /// Points of the record the power is cut at.
    pub cuts: usize,
    pub seed: u64,
    /// How writes after a file's last sync fare.
    pub fate: disk::Fate,
    /// `latch.db`'s log size past which it is checkpointed: small, so that a short run
    /// goes through many checkpoints.
    pub checkpoint_pages: i32,
}

/// A folder of its own, in memory where the machine has `/dev/shm` (the record, not the
/// real disk, says what a power cut keeps; the real files are only the live run's).
fn folder() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a folder")
}

/// What a run came to.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// Operations recorded, syncs among them, bytes written.
    pub ops: usize,
    pub syncs: usize,
    pub bytes: usize,
    /// Readings moved into the archive, retention rounds, and checkpoints of `latch.db`
    /// (syncs of the database file, which only a checkpoint writes) in the record.
    pub archived: usize,
    pub rounds: usize,
    pub checkpoints: usize,
    /// How many commits the rebuilt stores held short of the last acknowledged, at most.
    pub lost_tail: usize,
}

/// Each sensor's data and the device time of its last applied reading.
type States = HashMap<SensorId, (Option<bool>, Option<Millis>)>;

/// One group commit the workload made.
struct Commit {
    readings: Vec<ReadingRecord>,
    /// The sensors whose state changed, at the commit's time.
    events: Vec<SensorId>,
    at: Millis,
    /// The notifications it made (when it was acknowledged).
    notifications: Vec<String>,
    /// Where the record stood once the store answered; `None`: it failed.
    acked: Option<usize>,
    /// Every sensor's state (data, last applied device time) after it.
    states: Arc<States>,
}

/// A retention round: where the record stood when it began, and its cut-offs.
struct Round {
    began: usize,
    history_before: Millis,
    notifications_before: Millis,
}

/// Runs the workload on a fresh folder, then cuts the power at `settings.cuts` points.
pub fn run(settings: Settings) -> Report {
    vfs::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let live = folder();
        vfs::watch(live.path());
        let (commits, rounds, archived) = workload(live.path(), settings).await;
        let log = vfs::take();
        let mut report = Report {
            ops: log.ops.len(),
            archived,
            rounds: rounds.len(),
            ..Report::default()
        };
        for op in &log.ops {
            match op {
                vfs::Op::Sync { file } => {
                    report.syncs += 1;
                    if log.files[*file].ends_with("latch.db") {
                        report.checkpoints += 1;
                    }
                }
                vfs::Op::Write { data, .. } => report.bytes += data.len(),
                vfs::Op::Truncate { .. } | vfs::Op::Delete { .. } => {}
            }
        }
        let mut rng = StdRng::seed_from_u64(settings.seed);
        for _ in 0..settings.cuts {
            let cut = rng.gen_range(1..=log.ops.len());
            match cut_at(
                &log,
                cut,
                live.path(),
                &commits,
                &rounds,
                settings,
                &mut rng,
            )
            .await
            {
                Ok(lost) => report.lost_tail = report.lost_tail.max(lost),
                Err(v) => report.violations.push(format!(
                    "power cut at operation {cut} of {}: {v}",
                    log.ops.len()
                )),
            }
        }
        report
    })
}

/// The workload: commits from one task (as the engine's committer makes them), the
/// archive's moves, delivery's claims and results beside it, retention rounds and a backup
/// between commits. Answers the commits, the retention rounds and the readings moved.
async fn workload(dir: &Path, settings: Settings) -> (Vec<Commit>, Vec<Round>, usize) {
    let tuning = Tuning {
        checkpoint_pages: settings.checkpoint_pages,
    };
    let store =
        Arc::new(SqliteStore::open_tuned(dir, settings.sync, tuning).expect("the store opens"));
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
    let mut tick: Millis = 0;
    for n in 0..settings.commits {
        let mut batch = CommitBatch::default();
        let mut touched: BTreeMap<SensorId, ()> = BTreeMap::new();
        let mut events = Vec::new();
        let count = rng.gen_range(1..=12);
        for i in 0..=count {
            tick += 1;
            let now = START + tick * STEP;
            // The last reading of every commit is the marker's, at the commit's newest
            // time; the others go to random sensors, one in six late (a device time
            // before that sensor's last applied one). Each has a receive time of its own.
            let (id, data, ts) = if i == count {
                (marker, n % 2 == 0, now)
            } else {
                let id = ids[rng.gen_range(0..SENSORS)];
                let late = rng.gen_ratio(1, 6) && states[&id].1.is_some();
                let ts = if late {
                    states[&id].1.expect("checked") - 5
                } else {
                    now
                };
                (id, rng.gen_bool(0.5), ts)
            };
            let (data_now, last_ts) = states[&id];
            let late = last_ts.is_some_and(|t| ts < t);
            batch.readings.push(ReadingRecord {
                sensor_id: id,
                data,
                ts,
                received_at: now,
                late,
            });
            if late {
                continue;
            }
            let changed = data_now != Some(data);
            states.insert(id, (Some(data), Some(ts)));
            touched.insert(id, ());
            if changed && !events.contains(&id) {
                events.push(id);
            }
        }
        let at = START + tick * STEP;
        clock.store(at, Ordering::SeqCst);
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
            let round = Round {
                began: vfs::mark(),
                history_before: at - KEEP,
                notifications_before: at - KEEP,
            };
            let retention = Retention {
                history_before: Some(round.history_before),
                notifications_before: Some(round.notifications_before),
            };
            rounds.push(round);
            store
                .maintain(at, retention)
                .await
                .expect("a retention round");
        }
        if n == settings.commits / 2 {
            let (from, to) = (dir.to_path_buf(), folder());
            tokio::task::spawn_blocking(move || {
                latch::store::sqlite::backup(&from, &to.path().join("latch.backup"))
            })
            .await
            .expect("the backup ran")
            .expect("a backup");
        }
    }
    stop.store(true, Ordering::SeqCst);
    let archived = archiver.await.expect("the archiver ends");
    deliverer.await.expect("delivery ends");
    (commits, rounds, archived)
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
        let pending = store.load_pending(i64::MIN).await.expect("pending");
        let mut heads: Vec<String> = Vec::new();
        let mut lanes = Vec::new();
        for n in pending {
            let lane = (n.client_id.clone(), n.sensor_id);
            if !lanes.contains(&lane) {
                lanes.push(lane);
                heads.push(n.id);
            }
        }
        let now = clock.load(Ordering::SeqCst);
        let claims = store
            .claim(heads, "powercut".into(), now, now + 60_000, None)
            .await
            .expect("a claim");
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
        if !outcomes.is_empty() {
            store
                .record(outcomes, now, 86_400_000)
                .await
                .expect("results recorded");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Rebuilds the folder as of `cut`, opens the store on it and checks it; answers how many
/// acknowledged commits it lacks (a tail, allowed only with `normal`).
async fn cut_at(
    log: &vfs::Log,
    cut: usize,
    live: &Path,
    commits: &[Commit],
    rounds: &[Round],
    settings: Settings,
    rng: &mut StdRng,
) -> Result<usize, String> {
    let dir = folder();
    disk::rebuild(log, cut, settings.fate, rng, live, dir.path()).map_err(|e| e.to_string())?;
    // What latch writes outside SQLite (its key, the node id) was made at start.
    for entry in std::fs::read_dir(live).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let sqlite = name.ends_with(".db") || name.ends_with("-wal") || name.ends_with("-shm");
        if !sqlite && entry.path().is_file() {
            std::fs::copy(entry.path(), dir.path().join(&*name)).map_err(|e| e.to_string())?;
        }
    }
    let store = SqliteStore::open(dir.path(), settings.sync)
        .map_err(|e| format!("the store does not open: {e:#}"))?;
    for file in ["latch.db", "archive.db"] {
        let path = dir.path().join(file);
        if !path.exists() {
            continue;
        }
        let c = rusqlite::Connection::open(&path).map_err(|e| e.to_string())?;
        let verdict: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        if verdict != "ok" {
            return Err(format!("{file} fails its integrity check: {verdict}"));
        }
    }
    check(&store, cut, commits, rounds, settings.sync).await
}

/// The checks of a rebuilt store (see the module's documentation).
async fn check(
    store: &SqliteStore,
    cut: usize,
    commits: &[Commit],
    rounds: &[Round],
    sync: Synchronous,
) -> Result<usize, String> {
    let begun: Vec<&Round> = rounds.iter().filter(|r| r.began < cut).collect();
    let history_before = begun.iter().map(|r| r.history_before).max();
    let notifications_before = begun.iter().map(|r| r.notifications_before).max();
    let may_be_pruned = |ts: Millis| history_before.is_some_and(|b| ts < b);

    // Every reading kept, by sensor and receive time (unique in the workload).
    let mut held: HashMap<(SensorId, Millis), (bool, bool, usize)> = HashMap::new();
    let mut sensors: Vec<SensorId> = commits
        .iter()
        .flat_map(|c| c.readings.iter().map(|r| r.sensor_id))
        .collect();
    sensors.sort_unstable();
    sensors.dedup();
    for id in &sensors {
        let mut page = PageRequest {
            limit: 1000,
            after: None,
        };
        loop {
            let p = store
                .list_readings(*id, TimeRange::default(), page.clone())
                .await
                .map_err(|e| format!("readings of {id} cannot be read: {e}"))?;
            for r in p.items {
                let e = held
                    .entry((*id, r.row.received_at))
                    .or_insert((r.row.data, r.row.late, 0));
                e.2 += 1;
            }
            match p.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
    }
    // The commits it holds: up to the newest whose marker's event is there (every commit
    // changes the marker's state; events, states and notifications live in `latch.db`,
    // readings may be in `archive.db` already).
    let marker = SensorId::parse(MARKER).expect("an id");
    let mut marked = std::collections::HashSet::new();
    let mut page = PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store
            .list_events(marker, TimeRange::default(), page.clone())
            .await
            .map_err(|e| format!("the marker's events cannot be read: {e}"))?;
        marked.extend(p.items.iter().map(|e| e.row.at));
        match p.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    let prefix = commits.iter().rposition(|c| marked.contains(&c.at));
    let held_commits = prefix.map_or(0, |p| p + 1);
    let acked = commits
        .iter()
        .rposition(|c| c.acked.is_some_and(|a| a <= cut))
        .map_or(0, |p| p + 1);
    if sync == Synchronous::Full && held_commits < acked {
        let lost = &commits[held_commits];
        return Err(format!(
            "{} acknowledged commits lost (the first, at {}, held {} readings)",
            acked - held_commits,
            lost.at - START,
            lost.readings.len()
        ));
    }
    let mut accounted = 0;
    for (n, c) in commits.iter().enumerate() {
        for r in &c.readings {
            let there = held.get(&(r.sensor_id, r.received_at));
            if n < held_commits {
                match there {
                    Some((_, _, count)) if *count > 1 => {
                        return Err(format!(
                            "reading {} at {} listed {count} times",
                            r.sensor_id,
                            r.ts - START
                        ));
                    }
                    Some((data, late, _)) if (*data, *late) != (r.data, r.late) => {
                        return Err(format!(
                            "reading {} at {} holds data {data} late {late}, not {} {}",
                            r.sensor_id,
                            r.ts - START,
                            r.data,
                            r.late
                        ));
                    }
                    Some(_) => accounted += 1,
                    None if may_be_pruned(r.ts) => {}
                    None => {
                        return Err(format!(
                            "reading {} at {} of commit {n} is missing, though the store holds commits up to {}{}",
                            r.sensor_id,
                            r.ts - START,
                            held_commits.saturating_sub(1),
                            if c.acked.is_some_and(|a| a <= cut) {
                                " (it was acknowledged)"
                            } else {
                                ""
                            }
                        ));
                    }
                }
            } else if there.is_some() && sync == Synchronous::Full {
                // With `normal`, the archive may have moved the readings of a commit that
                // `latch.db` then lost: they stay listed (README, Configuration).
                return Err(format!(
                    "reading {} at {} of commit {n} is there, though commit {} after it is not: not a prefix",
                    r.sensor_id,
                    r.ts - START,
                    held_commits
                ));
            }
        }
    }
    if sync == Synchronous::Normal {
        accounted += commits[held_commits..]
            .iter()
            .flat_map(|c| &c.readings)
            .filter(|r| held.contains_key(&(r.sensor_id, r.received_at)))
            .count();
    }
    if accounted != held.len() {
        return Err(format!(
            "{} readings the workload never committed are listed",
            held.len() - accounted
        ));
    }
    // States: as the held commits left them.
    let expected = match held_commits {
        0 => None,
        n => Some(commits[n - 1].states.clone()),
    };
    for (id, state) in store
        .load_runtime()
        .await
        .map_err(|e| format!("the state cannot be read: {e}"))?
    {
        let want = expected
            .as_ref()
            .and_then(|s| s.get(&id).copied())
            .unwrap_or((None, None));
        if (state.data, state.last_ts) != want {
            return Err(format!(
                "sensor {id} holds data {:?} last_ts {:?}, but its readings give {:?}",
                state.data,
                state.last_ts.map(|t| t - START),
                (want.0, want.1.map(|t| t - START))
            ));
        }
    }
    // Events and notifications: those of the held commits, none of the others.
    let mut events = std::collections::HashSet::new();
    let (mut ids, mut last) = (
        std::collections::HashSet::new(),
        std::collections::HashMap::new(),
    );
    for id in &sensors {
        let mut page = PageRequest {
            limit: 1000,
            after: None,
        };
        loop {
            let p = store
                .list_events(*id, TimeRange::default(), page.clone())
                .await
                .map_err(|e| format!("events cannot be read: {e}"))?;
            // Once each, by id and by time, in (time, id) order: a move of the events'
            // journal copies (keeping ids) and deletes in one transaction, so no cut
            // leaves an event in both tables.
            for e in &p.items {
                let key = (e.row.at, e.id);
                if last.get(id).is_some_and(|l| *l >= key) {
                    return Err(format!("the events of {id} are out of order at {key:?}"));
                }
                last.insert(*id, key);
                if !ids.insert(e.id) || !events.insert((*id, e.row.at)) {
                    return Err(format!("the event of {id} at {} is listed twice", e.row.at));
                }
            }
            match p.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
    }
    let mut notifications = std::collections::HashSet::new();
    let mut page = PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store
            .list_notifications(NotificationFilter::default(), page.clone())
            .await
            .map_err(|e| format!("notifications cannot be read: {e}"))?;
        notifications.extend(p.items.into_iter().map(|n| n.id));
        match p.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    for (n, c) in commits.iter().enumerate() {
        let held = n < held_commits;
        for id in &c.events {
            let there = events.contains(&(*id, c.at));
            if held && !there && !may_be_pruned(c.at) {
                return Err(format!("the event of {id} of commit {n} is missing"));
            }
            if !held && there {
                return Err(format!(
                    "the event of {id} of commit {n} is there, though its commit is not"
                ));
            }
        }
        let prunable = notifications_before.is_some_and(|b| c.at < b);
        for id in &c.notifications {
            let there = notifications.contains(id);
            if held && !there && !prunable {
                return Err(format!("notification {id} of commit {n} is missing"));
            }
            if !held && there {
                return Err(format!(
                    "notification {id} of commit {n} is there, though its commit is not"
                ));
            }
        }
    }
    Ok(acked.saturating_sub(held_commits))
}
