//! Delivery's progress in this process, beside `latch_notifications_total{status="delivered"}`
//! and `latch_notifications_pending`: `latch bench` watches its in-process latch with an
//! atomic load, where a `/metrics` scrape renders every family in latch's own process (four
//! scrapes a second were ~3 % of the CPU the delivery bench charged to latch).

use std::sync::atomic::{AtomicU64, Ordering};

static DELIVERED: AtomicU64 = AtomicU64::new(0);
static ENDED: AtomicU64 = AtomicU64::new(0);
static PENDING: AtomicU64 = AtomicU64::new(0);

/// Notifications delivered since this process started (every latch in it, as the metrics
/// count them too).
pub fn delivered_total() -> u64 {
    DELIVERED.load(Ordering::Relaxed)
}

/// Notifications that reached a final status since this process started (every latch in
/// it), as `latch_notifications_total` counts them across its statuses.
pub fn ended_total() -> u64 {
    ENDED.load(Ordering::Relaxed)
}

/// Notifications the dispatcher holds now (the last dispatcher to report, when a process
/// runs several latches).
pub fn pending_now() -> u64 {
    PENDING.load(Ordering::Relaxed)
}

pub(crate) fn ended(n: u64) {
    ENDED.fetch_add(n, Ordering::Relaxed);
}

pub(super) fn delivered(n: u64) {
    DELIVERED.fetch_add(n, Ordering::Relaxed);
}

pub(super) fn pending(n: usize) {
    PENDING.store(n as u64, Ordering::Relaxed);
}
