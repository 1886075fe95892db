//! Backup, restore and vacuum of the embedded store: `latch backup`, `latch restore`,
//! `latch vacuum`.
//!
//! A backup is SQLite's online backup of `latch.db` into one file, made by another process
//! while latch serves: the copy is taken in one step inside one read transaction, so it is
//! the database as of one commit (every reading acknowledged before the backup began is in
//! it), and in WAL mode a reader never stops the writer: ingest goes on meanwhile (the
//! write-ahead log just is not checkpointed past the copy until it ends). A copy in many
//! small steps would start over whenever latch commits, which under steady ingest is always.
//!
//! A backup is 0600 whatever the umask: it holds every secret the store does.
//!
//! Restore and vacuum need the data folder to themselves: they take its lock, which a
//! running latch holds, and are refused while one runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use rusqlite::{Connection, OpenFlags};

use super::MIGRATIONS;
use crate::store::lock_data_dir;

const DB: &str = "latch.db";

/// Copies the data folder's database into `to` (written as `to.partial`, then renamed, so a
/// failed backup never leaves a file that looks whole). Returns its size in bytes.
pub fn backup(dir: &Path, to: &Path) -> anyhow::Result<u64> {
    let path = dir.join(DB);
    ensure!(
        path.exists(),
        "data_dir: no latch database in {}",
        dir.display()
    );
    let src = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .with_context(|| format!("cannot open {}", path.display()))?;
    src.busy_timeout(Duration::from_secs(10))?;
    let partial = partial(to);
    let _ = std::fs::remove_file(&partial);
    // It holds every secret latch keeps: its owner's alone, whatever the umask (its
    // journal takes its mode).
    crate::store::private_file(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut dst = Connection::open(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    {
        let copy = rusqlite::backup::Backup::new(&src, &mut dst)?;
        // All pages in one step: one read transaction, one consistent copy.
        loop {
            match copy.step(-1)? {
                rusqlite::backup::StepResult::Done => break,
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    // One file: the archive's readings go in too, read after the copy (a reading moved
    // meanwhile is then in both the journal and the archive, which reads and the next
    // move take as one).
    super::archive::copy_into_backup(&dst, &path)
        .context("cannot copy the archive of readings into the backup")?;
    // No write-ahead log beside it.
    dst.pragma_update(None, "journal_mode", "DELETE")?;
    check(&dst).with_context(|| format!("the copy in {} is not whole", partial.display()))?;
    drop(dst);
    std::fs::File::open(&partial)?.sync_all()?;
    std::fs::rename(&partial, to)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), to.display()))?;
    sync_dir(to);
    Ok(std::fs::metadata(to)?.len())
}

/// Replaces the data folder's database (and the archive's file) with the backup `from`.
/// Refused while a latch runs on the folder, for a file that is not a whole latch database
/// this latch can run, and when `keys` lack the key the backup's secrets are sealed under:
/// the store would not start without it, and a refusal before anything is replaced says so
/// while the old data is still there. Answers the key the backup needs (`None`: none).
pub fn restore(
    dir: &Path,
    from: &Path,
    keys: &crate::secrets::Keyring,
) -> anyhow::Result<Option<String>> {
    let _lock = lock_data_dir(dir).map_err(|e| {
        anyhow::anyhow!("{e}: stop latch before restoring (latch restore replaces its data)")
    })?;
    let src = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("cannot open {}", from.display()))?;
    check(&src).with_context(|| format!("{} is not a whole latch backup", from.display()))?;
    let version: usize = src.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    ensure!(
        version <= MIGRATIONS.len(),
        "{} is at schema version {version}, newer than this latch knows ({}): restore it with \
         the latch that made it",
        from.display(),
        MIGRATIONS.len()
    );
    let has_outbox: bool = src.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'notifications')",
        [],
        |r| r.get(0),
    )?;
    ensure!(has_outbox, "{} is not a latch database", from.display());
    let needs = sealing_key(&src)?;
    if let Some(id) = &needs {
        check_key(dir, from, id, keys)?;
    }
    drop(src);
    crate::store::private_file(&dir.join(DB))?;
    let mut dst = Connection::open(dir.join(DB))?;
    dst.pragma_update(None, "journal_mode", "WAL")?;
    // Through SQLite, page by page in its own transactions: the database and its
    // write-ahead log stay one consistent whole at every moment.
    dst.restore(
        rusqlite::MAIN_DB,
        from,
        None::<fn(rusqlite::backup::Progress)>,
    )?;
    dst.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    drop(dst);
    // The backup's archive goes into its own file again, in place of the replaced one.
    super::archive::split(&dir.join(DB))?;
    // SQLite made the archive's file under the umask.
    crate::store::private_files(dir)?;
    Ok(needs)
}

/// The key a database's secrets are sealed under; `None` for one that recorded none (no
/// secret sealed yet, or made before secrets were sealed).
fn sealing_key(db: &Connection) -> anyhow::Result<Option<String>> {
    let has_table: bool = db.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'secret_key')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(None);
    }
    use rusqlite::OptionalExtension;
    Ok(db
        .query_row("SELECT current FROM secret_key WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()?)
}

/// Refuses a restore whose key `keys` lack, saying which key and where it was looked for.
fn check_key(
    dir: &Path,
    from: &Path,
    id: &str,
    keys: &crate::secrets::Keyring,
) -> anyhow::Result<()> {
    let held = match keys.prepare(Some(id)) {
        Ok(_) => return Ok(()),
        Err(crate::secrets::Error::MissingKey(_)) => "does not hold it".to_string(),
        Err(e) => format!("cannot be read: {e}"),
    };
    bail!(
        "nothing restored: {} needs key {id} (its clients' secrets are sealed under it), and \
         {} {held}. Put the key file kept with the backup at {} (or give the key in \
         LATCH_SECRET_KEY or LATCH_SECRET_KEY_FILE) and run latch restore again",
        from.display(),
        keys.source().describe(),
        dir.join(crate::secrets::KEY_FILE).display()
    )
}

/// Rewrites the database (and the archive's file) without its free pages, giving them back
/// to the disk. Refused while a latch runs on the folder. Returns the size before and
/// after, in bytes.
pub fn vacuum(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let _lock =
        lock_data_dir(dir).map_err(|e| anyhow::anyhow!("{e}: stop latch before `latch vacuum`"))?;
    let path = dir.join(DB);
    if !path.exists() {
        bail!("data_dir: no latch database in {}", dir.display());
    }
    let size = |c: &Connection| -> rusqlite::Result<u64> {
        c.query_row(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            [],
            |r| r.get(0),
        )
    };
    let (mut before, mut after) = (0, 0);
    let archive = super::archive::path(&path);
    for file in std::iter::once(&path).chain(archive.exists().then_some(&archive)) {
        let conn = Connection::open(file)?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        before += size(&conn)?;
        conn.execute_batch("VACUUM")?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        after += size(&conn)?;
    }
    Ok((before, after))
}

/// SQLite's quick check: every page and index readable and consistent.
fn check(c: &Connection) -> anyhow::Result<()> {
    let verdict: String = c.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    ensure!(verdict == "ok", "quick_check: {verdict}");
    Ok(())
}

fn partial(to: &Path) -> PathBuf {
    let mut name = to.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Makes a rename in `path`'s folder durable (best effort: not every file system can).
fn sync_dir(path: &Path) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
