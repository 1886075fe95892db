//! Whether the store's disk is full, as its writes find it.
//!
//! A full disk refuses every write the same way, so reporting it per write would be one log
//! line per request. Instead a store notes the outcome of each write here, and only the
//! changes are told: one log line and the `latch_storage_full` gauge when the first write
//! fails for want of space, one more when a write succeeds again.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Error, Result};
use crate::telemetry::events::{Emit, StorageFreed, StorageFull};

/// The disk's state for one store.
#[derive(Debug, Default)]
pub struct Space {
    full: AtomicBool,
}

impl Space {
    /// Notes a write's outcome: a `Full` failure starts an episode, a success ends one;
    /// other failures say nothing of the disk.
    pub fn note<T>(&self, result: &Result<T>) {
        match result {
            Err(Error::Full(cause)) => {
                if !self.full.swap(true, Ordering::Relaxed) {
                    StorageFull { cause }.emit();
                }
            }
            Ok(_) => {
                if self.full.swap(false, Ordering::Relaxed) {
                    StorageFreed.emit();
                }
            }
            Err(_) => {}
        }
    }

    /// Whether the last write that said anything of the disk found it full.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_starts_at_the_first_full_write_and_ends_at_the_next_success() {
        let space = Space::default();
        assert!(!space.is_full());
        space.note::<()>(&Err(Error::Backend("no connection".into())));
        assert!(!space.is_full(), "other failures say nothing of the disk");
        space.note::<()>(&Err(Error::Full("database or disk is full".into())));
        space.note::<()>(&Err(Error::Full("database or disk is full".into())));
        assert!(space.is_full());
        space.note(&Ok(()));
        assert!(!space.is_full());
    }
}
