//! Power cuts of the embedded store (issue #48, part 2).
//!
//! The real SQLite store runs a real mix of work — group commits of readings, state and
//! notifications, moves of the journal into the archive (its own file, with its own
//! writer), claims and recorded attempts, retention rounds, a backup, and the write-ahead
//! logs' checkpoints beside them — through a VFS that records every write and sync of
//! each file ([`vfs`]), with what reaches the folder outside it: latch's own files, the
//! folder's syncs, deletes, renames and links ([`fs`]). Then, at many points of that
//! record, the data folder is rebuilt as a disk could hold it had the power gone then
//! ([`disk`]): what was synced is there, of the rest any part or none, writes torn at
//! sector edges (a sector old, new or garbage), and a name made, deleted, renamed or linked
//! there only if the folder was synced after it, or by chance. The store is opened on each
//! rebuilt folder, as a restart would, and checked:
//!
//! - it opens, and both files pass SQLite's integrity check;
//! - the commits it holds are a prefix of those made, each whole: every reading, event and
//!   notification of a commit in it is there, once, and none of a commit after it (only
//!   what a retention round already begun may have deleted is missing);
//! - each sensor's state is the one the readings of that prefix give;
//! - with `synchronous = full`, the prefix holds every commit acknowledged before the cut:
//!   nothing answered 202 is lost. With `normal`, the book's promise: a power cut may
//!   lose the last commits, never more than a tail of them;
//! - no notification is left leased, every delivered one has its attempt, and the readings'
//!   id counter is above every id the archive holds ([`after::leftovers`]);
//! - then the work of a restarted latch lands whole: the lost tail sent again and new
//!   readings, moves into the archive, every pending notification claimed and delivered
//!   ([`after::work`]).
//!
//! Two cuts in five land anywhere in the record; then each of the folder's operations is cut
//! just after, at every point up to three, before the folder's next sync (where it may be
//! lost: a file's name made before its bytes are synced, say); the rest land in windows:
//! the store's first open (files made, schema migrated), just after a move's copy into the
//! archive was synced (before the journal's delete), around a checkpoint, in a retention
//! round, in the backup. One cut in four is cut again: the rebuilt folder is opened
//! (recovery) under the recording VFS and the power cut during that too.

pub mod after;
pub mod check;
pub mod disk;
pub mod fs;
pub mod vfs;
pub mod workload;

use std::path::Path;

use latch::config::Synchronous;
use latch::domain::Millis;
use latch::store::sqlite::SqliteStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::vfs::{Log, Op};
use self::workload::Recorded;

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
/// The share of cuts cut again while the rebuilt folder recovers.
const RECUT: f64 = 0.25;
/// Points cut at after each of the folder's operations.
const FOLDER_POINTS: usize = 3;

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub sync: Synchronous,
    /// Group commits the workload makes.
    pub commits: usize,
    /// Points of the record the power is cut at.
    pub cuts: usize,
    pub seed: u64,
    /// How writes and the folder's operations after their last sync fare.
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
    /// Writes to a file issued while a sync of it was under way (a passive checkpoint's
    /// sync of the write-ahead log): not covered by that sync.
    pub written_while_syncing: usize,
    /// The folder's operations (names made, deleted, renamed, linked) and its syncs.
    pub folder_ops: usize,
    pub folder_syncs: usize,
    /// Cuts aimed at each window, and cuts cut again during recovery.
    pub aimed: Vec<(&'static str, usize)>,
    pub recut: usize,
    /// How many commits the rebuilt stores held short of the last acknowledged, at most.
    pub lost_tail: usize,
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
        let rec = workload::workload(live.path(), settings).await;
        let log = vfs::take();
        let mut report = Report {
            ops: log.ops.len(),
            archived: rec.archived,
            rounds: rec.rounds.len(),
            ..Report::default()
        };
        let mut syncing = std::collections::BTreeSet::new();
        for op in &log.ops {
            match op {
                Op::SyncStart { file } => {
                    syncing.insert(*file);
                }
                Op::Sync { file, .. } => {
                    syncing.remove(file);
                }
                Op::Write { file, .. } if syncing.contains(file) => {
                    report.written_while_syncing += 1
                }
                _ => {}
            }
            match op {
                Op::Sync { file, .. } if *file == Log::FOLDER => report.folder_syncs += 1,
                Op::Sync { file, .. } => {
                    report.syncs += 1;
                    if log.files[*file].ends_with("latch.db") {
                        report.checkpoints += 1;
                    }
                }
                Op::Write { data, .. } => report.bytes += data.len(),
                Op::Create { .. } | Op::Delete { .. } | Op::Rename { .. } | Op::Link { .. } => {
                    report.folder_ops += 1
                }
                Op::Truncate { .. } | Op::SyncStart { .. } => {}
            }
        }
        let mut rng = StdRng::seed_from_u64(settings.seed);
        let cuts = aim(&log, &rec, settings.cuts, &mut rng, &mut report);
        for (cut, window) in cuts {
            let recut = rng.gen_bool(RECUT);
            report.recut += recut as usize;
            match cut_at(&log, cut, recut, &rec, settings, &mut rng).await {
                Ok(lost) => report.lost_tail = report.lost_tail.max(lost),
                Err(v) => report.violations.push(format!(
                    "power cut at operation {cut} of {} ({window}{}): {v}",
                    log.ops.len(),
                    if recut { ", cut again in recovery" } else { "" }
                )),
            }
        }
        report
    })
}

/// The points to cut at, each with the window it was aimed at: two in five anywhere, then
/// every point just after each of the folder's operations (up to [`FOLDER_POINTS`], before
/// the folder's next sync: where the operation may be lost), the rest shared among the
/// other windows (see the module's documentation).
fn aim(
    log: &Log,
    rec: &Recorded,
    cuts: usize,
    rng: &mut StdRng,
    report: &mut Report,
) -> Vec<(usize, &'static str)> {
    let n = log.ops.len();
    let file_is = |file: usize, name: &str| log.files[file].ends_with(name);
    let mut windows: Vec<(&'static str, Vec<(usize, usize)>)> = vec![
        ("open", vec![(1, rec.opened)]),
        ("archive move", Vec::new()),
        ("checkpoint", Vec::new()),
        (
            "retention",
            rec.rounds.iter().map(|r| (r.began, r.ended)).collect(),
        ),
        ("backup", vec![rec.backup]),
    ];
    let mut folder = Vec::new();
    for (i, op) in log.ops.iter().enumerate() {
        match op {
            // The copy into the archive is synced; the journal's delete comes next.
            Op::Sync { file, .. } if file_is(*file, "archive.db-wal") => {
                windows[1].1.push((i + 1, i + 8))
            }
            Op::SyncStart { file } if file_is(*file, "latch.db") => {
                windows[2].1.push((i.saturating_sub(8), i + 8))
            }
            Op::Create { .. } | Op::Delete { .. } | Op::Rename { .. } | Op::Link { .. } => {
                // Up to the end of the folder's next sync, if it came.
                let synced = log.ops[i..]
                    .iter()
                    .position(|o| matches!(o, Op::Sync { file, .. } if *file == Log::FOLDER))
                    .map_or(n, |k| i + k + 1);
                folder
                    .extend((i + 1..=synced.min(i + FOLDER_POINTS).min(n)).map(|c| (c, "folder")));
            }
            _ => {}
        }
    }
    windows.retain(|(_, w)| !w.is_empty());
    let anywhere = cuts * 2 / 5;
    folder.truncate(cuts - anywhere);
    let aimed = cuts - anywhere - folder.len();
    let mut out: Vec<(usize, &'static str)> = (0..anywhere)
        .map(|_| (rng.gen_range(1..=n), "anywhere"))
        .collect();
    out.extend(folder);
    for k in 0..aimed {
        let (name, w) = &windows[k % windows.len()];
        let (from, to) = w[rng.gen_range(0..w.len())];
        let cut = rng.gen_range(from.max(1)..=to.max(from.max(1))).min(n);
        out.push((cut, name));
    }
    for name in windows.iter().map(|(name, _)| *name).chain(["folder"]) {
        let count = out.iter().filter(|(_, w)| *w == name).count();
        report.aimed.push((name, count));
    }
    out
}

/// Rebuilds the folder as of `cut` (and, if `recut`, cuts again while it recovers), opens
/// the store on it and checks it, then runs work on it; answers how many acknowledged
/// commits it lacks (a tail, allowed only with `normal`).
async fn cut_at(
    log: &Log,
    cut: usize,
    recut: bool,
    rec: &Recorded,
    settings: Settings,
    rng: &mut StdRng,
) -> Result<usize, String> {
    let mut dir = folder();
    disk::rebuild(log, cut, settings.fate, rng, dir.path()).map_err(|e| e.to_string())?;
    if recut {
        dir = recovery_cut(dir, settings, rng)?;
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
    let held = check::check(&store, cut, &rec.commits, &rec.rounds, settings.sync).await?;
    after::leftovers(dir.path())?;
    after::work(&store, held, rec).await?;
    Ok(held.lost)
}

/// Opens the store on the rebuilt `dir` under the recording VFS (its recovery: the log
/// replayed, the times of readings restored, leases released) and cuts the power at a
/// point of that: answers the folder rebuilt from there.
fn recovery_cut(
    dir: tempfile::TempDir,
    settings: Settings,
    rng: &mut StdRng,
) -> Result<tempfile::TempDir, String> {
    vfs::watch(dir.path());
    let opened = SqliteStore::open(dir.path(), settings.sync);
    let log = vfs::take();
    drop(opened.map_err(|e| format!("the store does not open (first recovery): {e:#}"))?);
    if log.ops.is_empty() {
        return Ok(dir);
    }
    let again = folder();
    let cut = rng.gen_range(1..=log.ops.len());
    disk::rebuild(&log, cut, settings.fate, rng, again.path()).map_err(|e| e.to_string())?;
    Ok(again)
}
