//! What a disk may hold after a power cut: the files of a recorded [`Log`] rebuilt as of a
//! point in it.
//!
//! Everything a file was sent before its last sync up to the cut is there. Of what it was
//! sent after that sync, any part may be there or not: each write is kept or dropped, and
//! a kept one may be torn, some of its 512-byte sectors written and the rest not. A file's
//! deletion is taken to be on the disk at once (it only ever removes a log SQLite no
//! longer needs).

use std::path::Path;

use rand::Rng;

use super::vfs::{Log, Op};

/// A sector: the unit a write is torn into.
const SECTOR: usize = 512;

/// How unsynced writes fare in a cut.
#[derive(Debug, Clone, Copy)]
pub struct Fate {
    /// Chance that a write sent after its file's last sync is on the disk.
    pub kept: f64,
    /// Chance that a kept one is torn.
    pub torn: f64,
}

/// Writes into `to` the files of `log` (by their names, from folder `from`) as a disk may
/// hold them after a power cut once `cut` operations had been issued.
pub fn rebuild(
    log: &Log,
    cut: usize,
    fate: Fate,
    rng: &mut impl Rng,
    from: &Path,
    to: &Path,
) -> std::io::Result<()> {
    let ops = &log.ops[..cut.min(log.ops.len())];
    // Where each file was last synced before the cut.
    let mut synced = vec![0usize; log.files.len()];
    for (i, op) in ops.iter().enumerate() {
        if let Op::Sync { file } = op {
            synced[*file] = i;
        }
    }
    let mut images: Vec<Option<Vec<u8>>> = vec![None; log.files.len()];
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Write { file, offset, data } => {
                let image = images[*file].get_or_insert_with(Vec::new);
                let offset = *offset as usize;
                if i < synced[*file] {
                    put(image, offset, data);
                } else if rng.gen_bool(fate.kept) {
                    if rng.gen_bool(fate.torn) {
                        for (n, sector) in data.chunks(SECTOR).enumerate() {
                            if rng.gen_bool(0.5) {
                                put(image, offset + n * SECTOR, sector);
                            }
                        }
                    } else {
                        put(image, offset, data);
                    }
                }
            }
            Op::Truncate { file, size } => {
                if i < synced[*file] || rng.gen_bool(fate.kept) {
                    images[*file]
                        .get_or_insert_with(Vec::new)
                        .resize(*size as usize, 0);
                }
            }
            Op::Delete { file } => images[*file] = None,
            Op::Sync { .. } => {}
        }
    }
    for (file, image) in log.files.iter().zip(images) {
        let Some(image) = image else { continue };
        let relative = file.strip_prefix(from).unwrap_or(file);
        let path = to.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, image)?;
    }
    Ok(())
}

fn put(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    let end = offset + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset..end].copy_from_slice(data);
}
