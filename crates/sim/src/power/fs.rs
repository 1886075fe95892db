//! What reaches the watched folder outside SQLite's VFS, seen where it reaches the C
//! library: latch's own files (`std::fs`: the lock, the key, the store's files it makes
//! empty before SQLite opens them, the folder's fsync after them) and SQLite's calls below
//! its VFS (the folder's fsync when it makes a log, `unlink`).
//!
//! These are the C library's `fsync`, `fdatasync`, `unlink`, `rename` and `linkat`, defined
//! again in this program: the linker binds this program's calls (Rust's `std`, SQLite's C)
//! to these, which make the system call themselves and tell the log ([`super::vfs`]).
//! Nothing is recorded unless a folder is watched; a file SQLite opened through the VFS has
//! its syncs recorded there, not twice here (its deletes, which SQLite makes with `unlink`,
//! here). Linux only, as the test is: the path of a descriptor is read from `/proc`.
//!
//! ALICE (OSDI '14) and SQLite's own crash test take the same view of a folder: a name
//! made, removed or renamed is on the disk only once the folder is synced after it, so
//! this is what a power cut may lose ([`super::disk`]).

use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};

use super::vfs::{self, Log, Op};

/// The path an open descriptor names.
fn fd_path(fd: c_int) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

/// What a sync about to run is, in the log: `(file, its SyncStart op)`.
fn sync_starts(fd: c_int) -> Option<(usize, usize)> {
    if !vfs::watching() {
        return None;
    }
    let path = fd_path(fd)?;
    let mut log = vfs::log();
    let folder = log.watched()?.to_path_buf();
    if path == folder {
        // Names made outside SQLite that the log has not seen yet are made before this
        // sync (their bytes as they are now, not synced).
        let mut names: Vec<PathBuf> = std::fs::read_dir(&folder)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for name in names {
            if !name.is_file() || vfs::is_index(&name) {
                continue;
            }
            let Some(id) = log.file(&name) else { continue };
            if !log.is_through_vfs(id) && !log.is_live(id) {
                snapshot(&mut log, id, &name);
            }
        }
        log.ops.push(Op::SyncStart { file: Log::FOLDER });
        return Some((Log::FOLDER, log.ops.len() - 1));
    }
    let id = log.file(&path)?;
    if log.is_through_vfs(id) || vfs::is_index(&path) {
        return None;
    }
    // A file written with `std::fs`: its bytes as the sync finds them.
    snapshot(&mut log, id, &path);
    log.ops.push(Op::SyncStart { file: id });
    Some((id, log.ops.len() - 1))
}

/// Records a file written outside SQLite as it is now: made (if the log has not seen it),
/// then its whole content written.
fn snapshot(log: &mut Log, id: usize, path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_default();
    log.made(id);
    log.ops.push(Op::Write {
        file: id,
        offset: 0,
        data: bytes.clone().into(),
    });
    log.ops.push(Op::Truncate {
        file: id,
        size: bytes.len() as u64,
    });
}

fn sync_ended(started: Option<(usize, usize)>, rc: c_int) {
    if rc == 0
        && let Some((file, started)) = started
    {
        vfs::log().ops.push(Op::Sync { file, started });
    }
}

/// A path the C library was given, made absolute.
unsafe fn c_path(p: *const c_char) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated path, as the C library's contract says.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    let path = PathBuf::from(s);
    Some(match path.is_absolute() {
        true => path,
        false => std::env::current_dir().ok()?.join(path),
    })
}

/// # Safety
/// The C library's `fsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    let started = sync_starts(fd);
    // SAFETY: the system call the C library's `fsync` makes.
    let rc = unsafe { libc::syscall(libc::SYS_fsync, fd) } as c_int;
    sync_ended(started, rc);
    rc
}

/// # Safety
/// The C library's `fdatasync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    let started = sync_starts(fd);
    // SAFETY: the system call the C library's `fdatasync` makes.
    let rc = unsafe { libc::syscall(libc::SYS_fdatasync, fd) } as c_int;
    sync_ended(started, rc);
    rc
}

/// # Safety
/// The C library's `unlink`: `path` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the system call the C library's `unlink` makes.
    let rc = unsafe { libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, path, 0) } as c_int;
    if rc == 0
        && vfs::watching()
        && let Some(p) = unsafe { c_path(path) }
    {
        let mut log = vfs::log();
        if let Some(id) = log.file(&p) {
            log.removed(id);
        }
    }
    rc
}

/// # Safety
/// The C library's `rename`: both paths are NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: the system call the C library's `rename` makes (renameat2 without flags:
    // every architecture has it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from,
            libc::AT_FDCWD,
            to,
            0,
        )
    } as c_int;
    if rc == 0
        && vfs::watching()
        && let (Some(f), Some(t)) = unsafe { (c_path(from), c_path(to)) }
    {
        let mut log = vfs::log();
        if let (Some(f), Some(t)) = (log.file(&f), log.file(&t)) {
            log.renamed(f, t);
        }
    }
    rc
}

/// # Safety
/// The C library's `linkat` (Rust's `hard_link`): both paths are NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn linkat(
    from_dir: c_int,
    from: *const c_char,
    to_dir: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: the system call the C library's `linkat` makes.
    let rc = unsafe { libc::syscall(libc::SYS_linkat, from_dir, from, to_dir, to, flags) } as c_int;
    if rc == 0
        && vfs::watching()
        && from_dir == libc::AT_FDCWD
        && to_dir == libc::AT_FDCWD
        && let (Some(f), Some(t)) = unsafe { (c_path(from), c_path(to)) }
    {
        let mut log = vfs::log();
        if let (Some(f), Some(t)) = (log.file(&f), log.file(&t)) {
            log.linked(f, t);
        }
    }
    rc
}
