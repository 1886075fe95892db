//! What a disk may hold after a power cut: the folder of a recorded [`Log`] rebuilt as of a
//! point in it.
//!
//! Files and names are apart, as on a real file system (and in ALICE's model): a file's
//! bytes are synced by its own fsync, the names in the folder by the folder's.
//!
//! - Of a file's bytes, everything it was sent before the start of its last finished sync
//!   is there. Of what it was sent after that, any part may be there or not: each write
//!   is kept or dropped, and a kept one may be torn, some of its 512-byte sectors written,
//!   others not, and some holding garbage (a sector the drive was writing when the power
//!   went), as SQLite's crash test allows.
//! - Of the folder's names, every create, delete, rename and link before the start of the
//!   folder's last finished sync is there; each one after it is there or not, on its own.
//!   A file whose name did not survive is gone with its bytes; a file deleted whose delete
//!   did not survive is back under its name.

use std::collections::BTreeMap;
use std::path::Path;

use rand::Rng;

use super::vfs::{Log, Op};

/// A sector: the unit a write is torn into.
const SECTOR: usize = 512;

/// How what was not synced fares in a cut.
#[derive(Debug, Clone, Copy)]
pub struct Fate {
    /// Chance that a write (or a folder's operation) issued after the last sync that
    /// covers it is on the disk.
    pub kept: f64,
    /// Chance that a kept write is torn.
    pub torn: f64,
    /// Chance that a sector of a torn write holds garbage rather than old or new bytes.
    pub garbage: f64,
}

/// A file's bytes, whatever names it had: each create makes a new one.
type Inode = usize;

/// Writes into `to` the files of `log` (by their names in the watched folder) as a disk
/// may hold them after a power cut once `cut` operations had been issued.
pub fn rebuild(
    log: &Log,
    cut: usize,
    fate: Fate,
    rng: &mut impl Rng,
    to: &Path,
) -> std::io::Result<()> {
    let ops = &log.ops[..cut.min(log.ops.len())];
    // First the files as the process saw them: which inode each op is about, and where
    // each inode's (and the folder's) last finished sync began.
    let mut names: BTreeMap<usize, Inode> = BTreeMap::new();
    for (inode, (file, _)) in log.base.iter().enumerate() {
        names.insert(*file, inode);
    }
    let on_disk = names.clone();
    let mut inodes = log.base.len();
    let mut inode_of: Vec<Option<Inode>> = vec![None; ops.len()];
    // Files written that the log never saw made: there before it began.
    let mut found: Vec<(usize, usize, Inode)> = Vec::new();
    let mut synced: BTreeMap<Inode, usize> = BTreeMap::new();
    let mut folder_synced = 0;
    for (i, op) in ops.iter().enumerate() {
        inode_of[i] = match op {
            Op::Create { file } => {
                inodes += 1;
                names.insert(*file, inodes - 1);
                Some(inodes - 1)
            }
            Op::Delete { file } => names.remove(file),
            Op::Rename { from, to } => {
                let inode = names.remove(from);
                if let Some(inode) = inode {
                    names.insert(*to, inode);
                }
                inode
            }
            Op::Link { from, to } => {
                let inode = names.get(from).copied();
                if let Some(inode) = inode {
                    names.insert(*to, inode);
                }
                inode
            }
            Op::Write { file, .. } | Op::Truncate { file, .. } | Op::SyncStart { file }
                if *file != Log::FOLDER =>
            {
                Some(*names.entry(*file).or_insert_with(|| {
                    inodes += 1;
                    found.push((i, *file, inodes - 1));
                    inodes - 1
                }))
            }
            Op::Sync { file, started } if *file == Log::FOLDER => {
                folder_synced = folder_synced.max(*started);
                None
            }
            Op::Sync { started, .. } => {
                if let Some(inode) = inode_of[*started] {
                    let s = synced.entry(inode).or_insert(0);
                    *s = (*s).max(*started);
                }
                None
            }
            _ => None,
        };
    }
    // Then what the disk holds: every inode's bytes, and the folder's names.
    let mut bytes: Vec<Vec<u8>> = vec![Vec::new(); inodes];
    for (inode, (_, b)) in log.base.iter().enumerate() {
        bytes[inode] = b.clone();
    }
    let mut disk = on_disk;
    let mut found = found.into_iter().peekable();
    for (i, op) in ops.iter().enumerate() {
        while let Some((_, file, inode)) = found.next_if(|f| f.0 == i) {
            disk.entry(file).or_insert(inode);
        }
        let covered = match (op, inode_of[i]) {
            (Op::Create { .. } | Op::Delete { .. } | Op::Rename { .. } | Op::Link { .. }, _) => {
                i < folder_synced
            }
            (_, Some(inode)) => synced.get(&inode).is_some_and(|s| i < *s),
            _ => false,
        };
        let kept = covered || rng.gen_bool(fate.kept);
        match (op, inode_of[i]) {
            (Op::Write { offset, data, .. }, Some(inode)) => {
                if covered {
                    put(&mut bytes[inode], *offset as usize, data);
                } else if kept {
                    write_maybe_torn(&mut bytes[inode], *offset as usize, data, fate, rng);
                }
            }
            (Op::Truncate { size, .. }, Some(inode)) if kept => {
                bytes[inode].resize(*size as usize, 0);
            }
            (Op::Create { file }, Some(inode)) if kept => {
                disk.insert(*file, inode);
            }
            (Op::Delete { file }, _) if kept => {
                disk.remove(file);
            }
            (Op::Rename { from, to }, Some(inode)) if kept => {
                disk.remove(from);
                disk.insert(*to, inode);
            }
            (Op::Link { to, .. }, Some(inode)) if kept => {
                disk.insert(*to, inode);
            }
            _ => {}
        }
    }
    for (file, inode) in disk {
        let path = &log.files[file];
        let relative = path.strip_prefix(&log.files[Log::FOLDER]).unwrap_or(path);
        let path = to.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, &bytes[inode])?;
    }
    Ok(())
}

/// A write that reached the disk whole, or torn at sector edges: each sector new, old, or
/// garbage.
fn write_maybe_torn(
    image: &mut Vec<u8>,
    offset: usize,
    data: &[u8],
    fate: Fate,
    rng: &mut impl Rng,
) {
    if !rng.gen_bool(fate.torn) {
        put(image, offset, data);
        return;
    }
    for (n, sector) in data.chunks(SECTOR).enumerate() {
        let at = offset + n * SECTOR;
        if rng.gen_bool(fate.garbage) {
            let junk: Vec<u8> = (0..sector.len()).map(|_| rng.r#gen()).collect();
            put(image, at, &junk);
        } else if rng.gen_bool(0.5) {
            put(image, at, sector);
        }
    }
}

fn put(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    let end = offset + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset..end].copy_from_slice(data);
}
