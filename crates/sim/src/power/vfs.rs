//! A SQLite VFS that records what reaches each file and when the file was synced, over
//! the platform's own VFS, which still does every read, write and lock.
//!
//! Installed as the process's default VFS ([`install`]), so the store's connections, its
//! checkpointer, its archive's writer and its backups all go through it without knowing.
//! Only files under a watched folder ([`watch`]) are recorded: writes (with their bytes),
//! truncations, syncs, and the folder's own operations (a file made, deleted or renamed,
//! the folder synced), in one log, in the order they were issued. SQLite itself keeps two
//! writers off one file (its locks), so the order of each file's writes in the log is the
//! order they reached the file; a sync is logged when it starts and when it ends, since a
//! passive checkpoint syncs the write-ahead log while the writer appends to it, and a frame
//! appended during the sync is not covered by it. The shared-memory index (`-shm`) is not
//! recorded: after a power cut SQLite rebuilds it from the log.
//!
//! What reaches the folder outside SQLite's VFS (a file latch makes with `std::fs`, the
//! folder's fsync SQLite does when it makes a log, a delete) is seen where it reaches the
//! C library ([`super::fs`]).
//!
//! [`super::disk`] turns the log into the files a disk could hold after a power cut at
//! any point of it.

use std::collections::BTreeSet;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rusqlite::ffi;

/// One operation on a recorded file or on the watched folder.
#[derive(Debug, Clone)]
pub enum Op {
    Write {
        file: usize,
        offset: u64,
        data: Box<[u8]>,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    /// A sync of `file` (or of the folder: [`Log::FOLDER`]) began.
    SyncStart {
        file: usize,
    },
    /// The sync that began at op `started` ended: everything written to the file (for the
    /// folder: every name made, deleted or renamed in it) before that op is on the disk.
    Sync {
        file: usize,
        started: usize,
    },
    /// A new file, under a name of the folder: its name is on the disk only once the folder
    /// is synced after it.
    Create {
        file: usize,
    },
    /// A name removed; the file it named is gone once the folder is synced after it.
    Delete {
        file: usize,
    },
    /// The file named `from` is named `to` (any file `to` named is gone).
    Rename {
        from: usize,
        to: usize,
    },
    /// The file named `from` is also named `to`.
    Link {
        from: usize,
        to: usize,
    },
}

/// The recorded log: the files by id, and the operations.
#[derive(Debug, Default)]
pub struct Log {
    /// Each recorded path (the folder's first); its place is its id.
    pub files: Vec<PathBuf>,
    pub ops: Vec<Op>,
    /// The files the folder held when the recording began (on the disk, synced): their id
    /// and bytes.
    pub base: Vec<(usize, Vec<u8>)>,
    watched: Option<PathBuf>,
    /// The names the folder holds now, as the log has seen them made and removed.
    live: BTreeSet<usize>,
    /// Files SQLite opened through this VFS: their writes and syncs are recorded here, not
    /// where they reach the C library.
    through_vfs: BTreeSet<usize>,
}

impl Log {
    /// The folder's own id: its syncs make the names in it durable.
    pub const FOLDER: usize = 0;

    pub(super) fn file(&mut self, path: &Path) -> Option<usize> {
        if !path.starts_with(self.watched.as_ref()?) {
            return None;
        }
        Some(match self.files.iter().position(|f| f == path) {
            Some(id) => id,
            None => {
                self.files.push(path.to_path_buf());
                self.files.len() - 1
            }
        })
    }

    /// Records that `file` is there under its name, if the log has not seen it made: made
    /// outside SQLite, and seen now.
    pub(super) fn made(&mut self, file: usize) {
        if self.live.insert(file) {
            self.ops.push(Op::Create { file });
        }
    }

    pub(super) fn removed(&mut self, file: usize) {
        if self.live.remove(&file) {
            self.ops.push(Op::Delete { file });
        }
    }

    pub(super) fn renamed(&mut self, from: usize, to: usize) {
        if self.live.remove(&from) {
            self.live.insert(to);
            self.ops.push(Op::Rename { from, to });
        }
    }

    pub(super) fn linked(&mut self, from: usize, to: usize) {
        if self.live.contains(&from) {
            self.live.insert(to);
            self.ops.push(Op::Link { from, to });
        }
    }

    pub(super) fn is_live(&self, file: usize) -> bool {
        self.live.contains(&file)
    }

    pub(super) fn is_through_vfs(&self, file: usize) -> bool {
        self.through_vfs.contains(&file)
    }

    pub(super) fn watched(&self) -> Option<&Path> {
        self.watched.as_deref()
    }
}

/// Whether a folder is watched: the C library's calls look no further when not.
static WATCHING: AtomicBool = AtomicBool::new(false);

pub(super) fn watching() -> bool {
    WATCHING.load(Ordering::Relaxed)
}

pub(super) fn log() -> MutexGuard<'static, Log> {
    static LOG: OnceLock<Mutex<Log>> = OnceLock::new();
    LOG.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Records the files under `dir` from now on, in a log started afresh; the files it holds
/// now are its base (on the disk).
pub fn watch(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut log = log();
    *log = Log {
        files: vec![dir.clone()],
        watched: Some(dir.clone()),
        ..Log::default()
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    for path in names {
        if path.is_file() && !is_index(&path) {
            let bytes = std::fs::read(&path).unwrap_or_default();
            let id = log.file(&path).expect("under the folder");
            log.live.insert(id);
            log.base.push((id, bytes));
        }
    }
    WATCHING.store(true, Ordering::Relaxed);
}

/// SQLite's shared-memory index, rebuilt after a cut: never recorded.
pub(super) fn is_index(path: &Path) -> bool {
    path.to_string_lossy().ends_with("-shm")
}

/// How many operations the log holds: a point of it that later work is measured against.
pub fn mark() -> usize {
    log().ops.len()
}

/// Stops recording and hands the log over.
pub fn take() -> Log {
    WATCHING.store(false, Ordering::Relaxed);
    std::mem::take(&mut *log())
}

/// An open file: the platform VFS's file follows this header in the same allocation.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    /// Its id in the log, if it is recorded.
    id: Option<usize>,
    real: *mut ffi::sqlite3_file,
}

/// Where the platform's file starts within ours (8-byte aligned).
const HEADER: usize = std::mem::size_of::<File>().div_ceil(8) * 8;

struct Vfs {
    ours: ffi::sqlite3_vfs,
    real: *mut ffi::sqlite3_vfs,
}

// SAFETY: both are written once, before the VFS is registered, and only read after.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS: OnceLock<Box<Vfs>> = OnceLock::new();

/// Makes the recording VFS the process's default. Idempotent.
pub fn install() {
    VFS.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find(NULL) answers the default VFS, which lives as long as
        // the process; registering a VFS that outlives every connection (a static) is
        // what SQLite asks.
        unsafe {
            assert_eq!(ffi::sqlite3_initialize(), ffi::SQLITE_OK);
            let real = ffi::sqlite3_vfs_find(std::ptr::null());
            assert!(!real.is_null(), "SQLite has a default VFS");
            let mut ours = *real;
            ours.zName = c"powercut".as_ptr();
            ours.szOsFile = (HEADER + (*real).szOsFile as usize) as c_int;
            ours.pNext = std::ptr::null_mut();
            ours.xOpen = Some(open);
            ours.xDelete = Some(delete);
            let vfs = Box::new(Vfs { ours, real });
            let rc = ffi::sqlite3_vfs_register(&vfs.ours as *const _ as *mut _, 1);
            assert_eq!(rc, ffi::SQLITE_OK, "the recording VFS is registered");
            vfs
        }
    });
}

fn vfs() -> &'static Vfs {
    VFS.get().expect("installed")
}

unsafe fn path_of(name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes a NUL-terminated name.
    let s = unsafe { CStr::from_ptr(name) };
    Some(PathBuf::from(s.to_string_lossy().into_owned()))
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let v = vfs();
    let f = file as *mut File;
    // SAFETY: SQLite gives `szOsFile` bytes at `file`; the platform's file goes after
    // our header, and its open is called with its own VFS.
    unsafe {
        let real = (file as *mut u8).add(HEADER) as *mut ffi::sqlite3_file;
        (*f).base.pMethods = std::ptr::null();
        (*f).real = real;
        (*f).id = None;
        let rc = ((*v.real).xOpen.expect("xOpen"))(v.real, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
            return rc;
        }
        if let Some(p) = path_of(name) {
            let mut log = log();
            if let Some(id) = log.file(&p) {
                // A file SQLite made now, or one made before outside it (latch makes
                // `latch.db` and `archive.db` empty, private, before SQLite opens them).
                log.made(id);
                log.through_vfs.insert(id);
                (*f).id = Some(id);
            }
        }
        (*f).base.pMethods = &METHODS;
        rc
    }
}

unsafe extern "C" fn delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync: c_int,
) -> c_int {
    let v = vfs();
    // SAFETY: forwarded as given.
    unsafe {
        // The C library's `unlink` records it ([`super::fs`]), and the folder's sync SQLite
        // does after it when `sync` says so.
        ((*v.real).xDelete.expect("xDelete"))(v.real, name, sync)
    }
}

/// The platform's file and its methods.
unsafe fn real(
    f: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: `f` is one of ours, opened by [`open`].
    unsafe {
        let real = (*(f as *mut File)).real;
        (real, &*(*real).pMethods)
    }
}

unsafe fn id(f: *mut ffi::sqlite3_file) -> Option<usize> {
    // SAFETY: as above.
    unsafe { (*(f as *mut File)).id }
}

unsafe extern "C" fn close(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xClose.expect("xClose")(r)
    }
}

unsafe extern "C" fn read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    off: i64,
) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xRead.expect("xRead")(r, buf, n, off)
    }
}

unsafe extern "C" fn write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    off: i64,
) -> c_int {
    unsafe {
        if let Some(file) = id(f) {
            let data = std::slice::from_raw_parts(buf as *const u8, n as usize);
            log().ops.push(Op::Write {
                file,
                offset: off as u64,
                data: data.into(),
            });
        }
        let (r, m) = real(f);
        m.xWrite.expect("xWrite")(r, buf, n, off)
    }
}

unsafe extern "C" fn truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    unsafe {
        if let Some(file) = id(f) {
            log().ops.push(Op::Truncate {
                file,
                size: size as u64,
            });
        }
        let (r, m) = real(f);
        m.xTruncate.expect("xTruncate")(r, size)
    }
}

unsafe extern "C" fn sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    unsafe {
        // Logged before the call: the writer may append to this file meanwhile (a passive
        // checkpoint syncs the write-ahead log while new frames go in), and those frames
        // are not covered by this sync. Only what was written before its start is.
        let started = id(f).map(|file| {
            let mut log = log();
            log.ops.push(Op::SyncStart { file });
            (file, log.ops.len() - 1)
        });
        let (r, m) = real(f);
        let rc = m.xSync.expect("xSync")(r, flags);
        if rc == ffi::SQLITE_OK
            && let Some((file, started)) = started
        {
            log().ops.push(Op::Sync { file, started });
        }
        rc
    }
}

unsafe extern "C" fn file_size(f: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xFileSize.expect("xFileSize")(r, size)
    }
}

unsafe extern "C" fn lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xLock.expect("xLock")(r, level)
    }
}

unsafe extern "C" fn unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xUnlock.expect("xUnlock")(r, level)
    }
}

unsafe extern "C" fn check_reserved(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xCheckReservedLock.expect("xCheckReservedLock")(r, out)
    }
}

unsafe extern "C" fn file_control(f: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xFileControl.expect("xFileControl")(r, op, arg)
    }
}

unsafe extern "C" fn sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xSectorSize.expect("xSectorSize")(r)
    }
}

unsafe extern "C" fn device(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xDeviceCharacteristics.expect("xDeviceCharacteristics")(r)
    }
}

unsafe extern "C" fn shm_map(
    f: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xShmMap.expect("xShmMap")(r, page, size, extend, out)
    }
}

unsafe extern "C" fn shm_lock(
    f: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xShmLock.expect("xShmLock")(r, offset, n, flags)
    }
}

unsafe extern "C" fn shm_barrier(f: *mut ffi::sqlite3_file) {
    unsafe {
        let (r, m) = real(f);
        m.xShmBarrier.expect("xShmBarrier")(r)
    }
}

unsafe extern "C" fn shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe {
        let (r, m) = real(f);
        m.xShmUnmap.expect("xShmUnmap")(r, delete)
    }
}

/// No memory-mapped pages: every read goes through [`read`], and every write through
/// [`write`], where it is recorded.
unsafe extern "C" fn fetch(
    _f: *mut ffi::sqlite3_file,
    _offset: i64,
    _n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe { *out = std::ptr::null_mut() };
    ffi::SQLITE_OK
}

unsafe extern "C" fn unfetch(_f: *mut ffi::sqlite3_file, _offset: i64, _p: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};
