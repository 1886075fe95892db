//! The data folder: one latch process per folder, and the node id kept in it.

/// Locks a data folder for this process: one latch per folder, whatever the backend (the
/// folder also holds the node id that leases are taken under).
pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot create {}: {e}", dir.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("latch.lock"))?;
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
pub fn node_id(dir: &std::path::Path) -> anyhow::Result<String> {
    let path = dir.join("node-id");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_string());
    }
    let id = format!("latch-{}", ulid::Ulid::new());
    std::fs::write(&path, &id)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot write {}: {e}", path.display()))?;
    Ok(id)
}
