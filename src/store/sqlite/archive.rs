//! The readings archive's own file, `archive.db`, beside `latch.db`.
//!
//! SQLite has one writer per file. With the archive in `latch.db`, every move of the
//! journal into it (about a third of the writer's time under load) held the writer every
//! group commit waits for. In a file of its own it has a writer of its own, on the other
//! core: ingest took 8–20 % more readings a second with half the batch p99 (BENCHMARKS.md,
//! eleventh pass).
//!
//! Every connection of the store attaches the file as `archive`; SQL names the table
//! `readings_archive` unqualified, which SQLite looks up in `main` first. A data folder
//! whose `latch.db` already holds archived readings (made before the split) keeps them
//! there and goes on as before (`Layout::InMain`); `latch backup` writes one file with the
//! archive in it, and `latch restore` splits it again.
//!
//! Writes to both files in one transaction (a sensor's delete, retention) are atomic in
//! each file but not across them should the machine crash mid-commit: at worst a deleted
//! sensor's archived readings stay behind, unread by anything but a sensor registered again
//! under the same id.
//!
//! Two things tie the files together across a power cut. `latch.db` records that the
//! archive was made (migration 0022), once the folder is synced after the file was made
//! (its name is on the disk then), and a folder that lost the file is refused rather than
//! given an empty one ([`ensure_present`]). No power cut the test plays reaches that (SQLite
//! syncs the folder when it makes the archive's log, before anything is moved); a copy of
//! the folder without the file, or a file system that lost it, would. And the archive keeps
//! the largest reading id moved into it (`archive_ids`): with `synchronous = normal`,
//! `latch.db` may lose the last commits after the archive's writer (which always syncs)
//! copied their readings, and its id counter goes back with them; handed out again, an id
//! met the archive's copy (same sensor, time and id), and the move's `INSERT OR IGNORE` and
//! every read kept the lost reading over the new one (found by the power-cut test). At
//! open the counter is raised past that mark ([`opened`]).

use std::path::{Path, PathBuf};

use rusqlite::Connection;

/// The file, beside `latch.db`.
pub(super) const FILE: &str = "archive.db";

/// The archive table, in whichever schema `schema` names.
fn create(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.readings_archive (
             sensor_id   TEXT NOT NULL,
             ts          INTEGER NOT NULL,
             id          INTEGER NOT NULL,
             received_at INTEGER NOT NULL,
             data        INTEGER NOT NULL,
             late        INTEGER NOT NULL,
             battery     INTEGER,
             tamper      INTEGER,
             fault       TEXT,
             PRIMARY KEY (sensor_id, ts, id)
         ) WITHOUT ROWID;"
    )
}

/// The columns the archive gained after it was first made (a reading's battery, tamper
/// flag and fault, issue #72), each with its type.
const ADDED: [(&str, &str); 3] = [
    ("battery", "INTEGER"),
    ("tamper", "INTEGER"),
    ("fault", "TEXT"),
];

/// Adds to the archive table in `schema` the columns an older latch made it without: the
/// archive may live in a file of its own, which the migrations of `latch.db` never touch.
fn widen(conn: &Connection, schema: &str) -> rusqlite::Result<()> {
    let have: Vec<String> = conn
        .prepare(&format!(
            "SELECT name FROM {schema}.pragma_table_info('readings_archive')"
        ))?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, kind) in ADDED {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!(
                "ALTER TABLE {schema}.readings_archive ADD COLUMN {name} {kind}"
            ))?;
        }
    }
    Ok(())
}

/// The archive's columns, in the order `INSERT … SELECT` copies them.
const COLUMNS: &str = "sensor_id, ts, id, received_at, data, late, battery, tamper, fault";

/// The largest reading id moved into the archive: one row, in the archive's own file.
fn create_ids(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.archive_ids (
             one     INTEGER PRIMARY KEY CHECK (one = 1),
             last_id INTEGER NOT NULL
         );"
    )
}

/// Whether `conn`'s `latch.db` has an archive table of its own.
fn in_main(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE name = 'readings_archive')",
        [],
        |r| r.get(0),
    )
}

/// Where a data folder keeps its archived readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// In `archive.db`, with a writer of its own.
    OwnFile,
    /// In `latch.db` (a folder made before the split, whose archive held readings then).
    InMain,
}

/// `archive.db` of the database at `db` (`…/latch.db`).
pub(super) fn path(db: &Path) -> PathBuf {
    db.with_file_name(FILE)
}

/// Decides the layout of the freshly migrated `latch.db` on `writer`: an archive table there
/// with rows stays; an empty one (a new folder, whose migrations made it) is dropped for
/// `archive.db`.
pub(super) fn layout(writer: &Connection) -> rusqlite::Result<Layout> {
    if in_main(writer)? {
        let rows: bool = writer.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.readings_archive)",
            [],
            |r| r.get(0),
        )?;
        if rows {
            widen(writer, "main")?;
            return Ok(Layout::InMain);
        }
        writer.execute_batch("DROP TABLE main.readings_archive")?;
    }
    Ok(Layout::OwnFile)
}

/// Attaches `archive.db` (made if missing, in WAL mode) to `conn` as `archive`.
pub(super) fn attach(conn: &Connection, db: &Path) -> rusqlite::Result<()> {
    conn.execute(
        "ATTACH DATABASE ?1 AS archive",
        [path(db).to_string_lossy()],
    )?;
    conn.pragma_update(Some("archive"), "journal_mode", "WAL")?;
    conn.execute_batch(&create("archive"))?;
    widen(conn, "archive")?;
    conn.execute_batch(&create_ids("archive"))
}

/// Refuses a folder whose `latch.db` records the archive's file while the file is missing:
/// attaching would make an empty one, and every archived reading would be gone unsaid.
pub(super) fn ensure_present(writer: &Connection, db: &Path) -> anyhow::Result<()> {
    let made: bool = writer.query_row("SELECT EXISTS (SELECT 1 FROM archive_made)", [], |r| {
        r.get(0)
    })?;
    let file = path(db);
    anyhow::ensure!(
        !made || file.exists(),
        "data_dir: {} is missing, though latch.db records that the readings' archive was made \
         there; opening would start an empty archive and lose every archived reading. Put the \
         file back (or restore the folder from a backup with `latch restore`); to go on \
         without the archived readings, remove the record with \
         `sqlite3 {} 'DELETE FROM archive_made'`",
        file.display(),
        db.display()
    );
    Ok(())
}

/// Once the archive is attached to the writer (and the folder synced: its name is on the
/// disk): records that it was made, and keeps the readings' id counter above every id the
/// archive holds.
pub(super) fn opened(writer: &Connection, layout: Layout) -> rusqlite::Result<()> {
    if layout == Layout::InMain {
        // One file: the journal and the archive go back together, ids and all.
        return writer.execute_batch(&create_ids("main"));
    }
    writer.execute_batch(
        "INSERT INTO archive_made (at) SELECT unixepoch('subsec') * 1000 \
           WHERE NOT EXISTS (SELECT 1 FROM archive_made);
         UPDATE sqlite_sequence SET seq = (SELECT last_id FROM archive_ids) \
           WHERE name = 'readings' AND seq < (SELECT last_id FROM archive_ids);
         INSERT INTO sqlite_sequence (name, seq) SELECT 'readings', last_id FROM archive_ids \
           WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'readings');",
    )
}

/// Keeps the archive's mark of the largest id moved into it, in the copy's transaction.
pub(super) fn moved_up_to(tx: &rusqlite::Transaction, last_id: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO archive_ids (one, last_id) VALUES (1, ?1) \
         ON CONFLICT (one) DO UPDATE SET last_id = max(last_id, excluded.last_id)",
    )?
    .execute([last_id])?;
    Ok(())
}

/// Moves the archived readings of a restored `latch.db` at `db` into a new `archive.db`
/// (any earlier one is removed first: it belongs to the data the restore replaced).
pub(super) fn split(db: &Path) -> anyhow::Result<()> {
    remove(db)?;
    let conn = Connection::open(db)?;
    // The backup's record of an archive file is the backed-up folder's: this folder's file
    // (made here, or at the next open) is recorded at the next open.
    let recorded: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE name = 'archive_made')",
        [],
        |r| r.get(0),
    )?;
    if recorded {
        conn.execute("DELETE FROM main.archive_made", [])?;
    }
    if !in_main(&conn)? {
        return Ok(());
    }
    attach(&conn, db)?;
    widen(&conn, "main")?;
    conn.execute_batch(&format!(
        "INSERT OR IGNORE INTO archive.readings_archive ({COLUMNS}) SELECT {COLUMNS} \
           FROM main.readings_archive ORDER BY sensor_id, ts, id;
         DROP TABLE main.readings_archive;",
    ))?;

    conn.query_row("PRAGMA archive.wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    conn.query_row("PRAGMA main.wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// Removes `archive.db` of `db` with its log, if any.
pub(super) fn remove(db: &Path) -> std::io::Result<()> {
    let file = path(db);
    for suffix in ["", "-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::remove_file(PathBuf::from(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Copies the archive of the live folder's `latch.db` at `db` into the backup `dst`, when
/// it is in `archive.db`: a backup is one file, with the archive in it.
pub(super) fn copy_into_backup(dst: &Connection, db: &Path) -> rusqlite::Result<()> {
    if in_main(dst)? || !path(db).exists() {
        return Ok(());
    }
    dst.execute("ATTACH DATABASE ?1 AS live", [path(db).to_string_lossy()])?;
    dst.execute_batch(&format!(
        "{}
         INSERT INTO main.readings_archive ({COLUMNS}) SELECT {COLUMNS} \
           FROM live.readings_archive ORDER BY sensor_id, ts, id;",
        create("main")
    ))?;
    dst.execute_batch("DETACH DATABASE live")
}
