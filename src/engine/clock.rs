//! Where the engine reads the time: the wall clock in service, one moved by hand in tests,
//! so liveness deadlines can be tested without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::domain::{Millis, time::now_ms};

/// Where the engine reads the time. Cheap to clone; clones share one time.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<AtomicI64>>);

impl Clock {
    /// The wall clock.
    pub fn wall() -> Self {
        Self(None)
    }

    /// A clock that shows `at` until [`Clock::set`] moves it.
    pub fn manual(at: Millis) -> Self {
        Self(Some(Arc::new(AtomicI64::new(at))))
    }

    pub fn now(&self) -> Millis {
        match &self.0 {
            None => now_ms(),
            Some(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Moves a manual clock; the wall clock cannot be moved and ignores this.
    pub fn set(&self, at: Millis) {
        if let Some(t) = &self.0 {
            t.store(at, Ordering::SeqCst);
        }
    }
}
