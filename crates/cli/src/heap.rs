//! Live bytes of Rust's heap, for `latch bench soak`: RSS alone cannot tell memory the
//! program still holds from memory the allocator keeps after it was freed, and mimalloc
//! keeps no such count in a release build. The binary's global allocator wraps mimalloc in
//! [`Counting`]; it counts only once a soak has switched it on, so every other command pays
//! one relaxed load per allocation. It lives in the binary, which owns the global
//! allocator; the soak is handed [`live`] to read it.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);

/// A global allocator that counts the bytes its inner one has handed out and not had back.
pub struct Counting<A>(pub A);

/// Starts counting; blocks allocated before are not counted, so call it before the work
/// measured starts (a drift of what those blocks free later is then small and one-off).
pub fn count() {
    ON.store(true, Ordering::Relaxed);
}

/// Bytes handed out and not freed since [`count`] was called.
pub fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

fn add(bytes: i64) {
    if ON.load(Ordering::Relaxed) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to the inner allocator unchanged; only a counter is added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) };
        add(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as i64 - layout.size() as i64);
        }
        p
    }
}
