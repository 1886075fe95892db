//! The data folder: one latch process per folder, the node id kept in it, and its privacy.
//!
//! The folder holds every client's signing secret and every broker password (in
//! `latch.db`, and in any backup of it), so it is the owner's alone whatever the umask
//! latch runs under: the folder 0700, every file latch makes in it 0600. SQLite makes a
//! database's `-wal`, `-shm` and `-journal` files with the database file's own mode, so a
//! database file made 0600 before SQLite first opens it keeps its log private too. A
//! folder others can write is refused: someone else could have put files there for latch
//! to read as its own.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Files latch makes in the data folder, by name or name prefix (`latch.db*`).
const OURS: [&str; 5] = [
    "latch.",
    "archive.db",
    "node-id",
    "latch.lock",
    crate::secrets::KEY_FILE,
];

/// Makes `dir` if missing, 0700, and makes an existing one 0700. Refuses a folder its
/// group or others can write.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot create {}: {e}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot read {}: {e}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o022 != 0 {
        anyhow::bail!(
            "data_dir: {} is a folder others can write (mode {:o}); latch keeps secrets there \
             and will not use it: make it its owner's alone (chmod 700 {}) or set \
             LATCH_DATA_DIR to another folder",
            dir.display(),
            mode & 0o7777,
            dir.display()
        );
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            anyhow::anyhow!(
                "data_dir: cannot make {} private (chmod 700): {e}",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// Makes the file at `path` 0600, creating it empty if missing (an empty file is a new
/// SQLite database).
pub fn private_file(path: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    if file.metadata()?.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Makes latch's files in `dir` 0600: those an earlier version made under the umask, and
/// those SQLite made beside a database (an archive attached, a restore's log).
pub fn private_files(dir: &Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // Not followed: a link's target is not latch's file.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file()
            || meta.permissions().mode() & 0o077 == 0
            || !OURS.iter().any(|o| name.starts_with(o))
        {
            continue;
        }
        let path = entry.path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
            anyhow::anyhow!(
                "data_dir: cannot make {} private (chmod 600): {e}",
                path.display()
            )
        })?;
    }
    Ok(())
}

/// Makes the names made in `dir` so far (its files, created or renamed) durable: a file's
/// own fsync keeps its bytes, not its name in the folder, which a power cut may lose until
/// the folder is synced (ALICE, OSDI '14). Best effort: not every file system can.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Locks a data folder for this process: one latch per folder, whatever the backend (the
/// folder also holds the node id that leases are taken under). Makes the folder private
/// first ([`private_dir`]), or refuses it.
pub fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    private_dir(dir)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join("latch.lock"))?;
    private_files(dir)?;
    // A latch that just stopped in this folder (in this process too: a restart in a test
    // or a bench) lets go within moments, once its last blocking store call returns.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while lock.try_lock().is_err() {
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "data_dir: {} is in use by another latch process",
                dir.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(lock)
}

/// This node's name on leases, kept in the data folder: a node restarted on the same folder
/// takes its own unexpired leases back at once instead of waiting them out.
pub fn node_id(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join("node-id");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_string());
    }
    let id = format!("latch-{}", ulid::Ulid::new());
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?
            .write_all(id.as_bytes())
    };
    write().map_err(|e| anyhow::anyhow!("data_dir: cannot write {}: {e}", path.display()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_folder_is_closed_up_and_one_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("latch.db"), b"").unwrap();
        std::fs::set_permissions(dir.join("latch.db"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        std::fs::write(dir.join("notes.txt"), b"").unwrap();
        std::fs::set_permissions(
            dir.join("notes.txt"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let _lock = lock_data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("latch.db")), 0o600);
        assert_eq!(mode(&dir.join("latch.lock")), 0o600);
        assert_eq!(mode(&dir.join("notes.txt")), 0o644, "not latch's");
        node_id(&dir).unwrap();
        assert_eq!(mode(&dir.join("node-id")), 0o600);

        for open in [0o777, 0o1777, 0o775, 0o757] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(open)).unwrap();
            let e = private_dir(&dir).unwrap_err().to_string();
            assert!(e.contains("others can write"), "{open:o}: {e}");
        }
    }
}
