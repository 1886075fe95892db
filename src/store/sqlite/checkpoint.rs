//! Checkpoints of the write-ahead log beside the writer, not in its commits.
//!
//! SQLite's automatic checkpoint runs inside the commit that takes the log past its limit:
//! it copies every page of the log into the database file and syncs that file while the
//! writer, and every batch waiting for it, waits. Here the writer only notes the log's size
//! after each commit (a WAL hook, read on the thread that committed); past
//! [`CHECKPOINT_PAGES`] (by default) it asks a thread of its own, on a connection of its own, which
//! copies with `PASSIVE` checkpoints (never blocking the writer) until what each pass finds
//! new is small, then holds the writer for one last pass over the rest. That last pass is
//! what lets the log start over: a log that is written to without a pause is never wholly
//! copied by passes that run beside it, and would grow for ever.
//!
//! Should the thread fall behind (a reader keeping an old snapshot, a slow disk), the
//! writer checkpoints itself once the log reaches [`BACKSTOP_TIMES`] that, as SQLite would.

use std::cell::Cell;
use std::os::raw::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use rusqlite::Connection;
use rusqlite::hooks::Wal;

use super::{Synchronous, Writer, open_conn};
use crate::telemetry::events::{Checkpointed, Emit};

/// Log size (pages of 4 KiB: ~40 MiB) past which it is checkpointed, unless the store is
/// opened with another ([`super::Tuning`]). Large, so that a page written by many commits
/// in between (an index's right edge, a hot leaf) goes to the database file once.
pub(super) const CHECKPOINT_PAGES: c_int = 10_000;

/// A log of [`CHECKPOINT_PAGES`] in bytes: the size its file is cut back to when it starts
/// over ([`super::LOG_LIMITS`]).
pub(super) const LOG_BYTES: i64 = log_bytes(CHECKPOINT_PAGES as i64);

/// The size of a log file holding `pages` pages of 4 KiB: a 32-byte header, and a 24-byte
/// header before each page.
pub(super) const fn log_bytes(pages: i64) -> i64 {
    32 + pages * (24 + 4_096)
}

/// Growth of the log after which the thread is asked again while it has not started over,
/// as a share of the checkpoint size: each round syncs the database file, which the
/// commits' own syncs wait behind.
const ASK_AGAIN_SHARE: c_int = 4;

/// Log size at which the writer checkpoints itself, in its commit, in checkpoint sizes.
const BACKSTOP_TIMES: c_int = 4;

/// Pages a pass beside the writer may still find new for the next pass to be the last one,
/// holding the writer: what that pass copies is what the writer waits for.
const LAST_PASS_PAGES: c_int = 250;

/// Passes beside the writer before the last one, at most.
const PASSES: usize = 8;

thread_local! {
    /// The log's size after the last commit on this thread, until taken.
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
}

fn note_wal(wal: &Wal, pages: c_int) -> rusqlite::Result<()> {
    // `latch.db`'s log only: the archive's file has a writer of its own, which checkpoints
    // it in its commits (a sensor's delete on this writer also writes there).
    if wal.name().to_bytes() == b"main" {
        WAL_PAGES.set(pages);
    }
    Ok(())
}

/// Makes `writer`'s commits note the log's size, in place of SQLite's own checkpoints.
pub(super) fn watch(writer: &Connection) {
    writer.wal_hook(Some(note_wal));
}

/// The log's size after the last commit on this thread since the last call; 0 if none.
fn take_wal_pages() -> c_int {
    WAL_PAGES.replace(0)
}

/// The thread that checkpoints beside the writer; stopped (and waited for) on drop.
pub(super) struct Checkpointer {
    ask: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The log's size after the last commit, and when the thread was last asked (0: not in
    /// this log's run); only written holding the writer.
    pages: AtomicI32,
    asked_at: AtomicI32,
    /// The log size past which it is checkpointed.
    limit: c_int,
}

impl Checkpointer {
    pub(super) fn start(
        path: &Path,
        sync: Synchronous,
        writer: Arc<Mutex<Writer>>,
        limit: c_int,
    ) -> anyhow::Result<Self> {
        let conn = open_conn(path, sync)?;
        let (ask, asked) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("latch-checkpoint".into())
            .spawn(move || run(conn, asked, writer))?;
        Ok(Self {
            ask: Some(ask),
            thread: Some(thread),
            pages: AtomicI32::new(0),
            asked_at: AtomicI32::new(0),
            limit,
        })
    }

    /// After a write, on the thread that made it and still holding the writer: asks for a
    /// checkpoint once the log is past its limit (again only after another
    /// [`ASK_AGAIN_SHARE`]th of it, should a reader keep the log from starting over), or
    /// runs one at once past [`BACKSTOP_TIMES`] the limit.
    pub(super) fn after_write(&self, writer: &Connection) {
        let pages = take_wal_pages();
        if pages == 0 {
            return;
        }
        if pages < self.pages.swap(pages, Ordering::Relaxed) {
            // The log started over.
            self.asked_at.store(0, Ordering::Relaxed);
        }
        let asked_at = self.asked_at.load(Ordering::Relaxed);
        if pages >= BACKSTOP_TIMES * self.limit {
            tracing::debug!(
                pages,
                "The write-ahead log outgrew the checkpoints beside the writer; the writer checkpoints it."
            );
            timed(|| passive(writer).map(|_| ()));
        } else if pages >= self.limit
            && (asked_at == 0 || pages >= asked_at + self.limit / ASK_AGAIN_SHARE)
            && let Some(ask) = &self.ask
        {
            self.asked_at.store(pages, Ordering::Relaxed);
            if let Err(TrySendError::Disconnected(_)) = ask.try_send(()) {
                tracing::warn!("The checkpoint thread is gone; the writer's backstop remains.");
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.ask.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conn: Connection, asked: Receiver<()>, writer: Arc<Mutex<Writer>>) {
    while asked.recv().is_ok() {
        timed(|| round(&conn, &writer));
    }
}

/// Runs a checkpoint, recording how long it took; a failure is logged (the next one, or the
/// writer's backstop, tries again).
fn timed(f: impl FnOnce() -> rusqlite::Result<()>) {
    let started = Instant::now();
    match f() {
        Ok(()) => Checkpointed {
            outcome: Ok(started.elapsed()),
        }
        .emit(),
        Err(e) => Checkpointed { outcome: Err(&e) }.emit(),
    }
}

/// Passes beside the writer until the next finds little new, then the last one holding it.
fn round(conn: &Connection, writer: &Mutex<Writer>) -> rusqlite::Result<()> {
    let mut copied_before: Option<c_int> = None;
    for _ in 0..PASSES {
        let (busy, log, copied) = passive(conn)?;
        // Another checkpoint runs (the writer's backstop), or a reader keeps part of the
        // log: the last pass could not finish it either.
        if busy || copied < log {
            return Ok(());
        }
        if copied_before.is_some_and(|b| copied - b <= LAST_PASS_PAGES) {
            break;
        }
        copied_before = Some(copied);
    }
    let _writer = writer.lock().unwrap_or_else(|p| p.into_inner());
    passive(conn)?;
    Ok(())
}

/// One `PASSIVE` checkpoint: whether another was running, the log's pages, and how many of
/// them are now in the database file.
fn passive(conn: &Connection) -> rusqlite::Result<(bool, c_int, c_int)> {
    // `main`: the writer has the archive's file attached too, which its own writer keeps.
    conn.query_row("PRAGMA main.wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?))
    })
}
