//! Where latch reads the time: the wall clock in service, a clock moved by hand in tests,
//! so liveness deadlines and retry delays are tested by moving time instead of sleeping.
//!
//! Everything that stamps or schedules (ingest's receive time, the engine's deadlines, the
//! dispatcher's due times, the API's retries) reads one shared `Clock`, so a moved clock
//! never leaves a part behind on the wall clock's time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::{Millis, time::now_ms};

/// A source of the current time. Cheap to clone; clones share one time.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<watch::Sender<Millis>>>);

impl Clock {
    /// The wall clock.
    pub fn wall() -> Self {
        Self(None)
    }

    /// A clock that shows `at` until [`Clock::set`] or [`Clock::advance`] moves it.
    pub fn manual(at: Millis) -> Self {
        Self(Some(Arc::new(watch::Sender::new(at))))
    }

    /// Whether this clock is moved by hand.
    pub fn is_manual(&self) -> bool {
        self.0.is_some()
    }

    pub fn now(&self) -> Millis {
        match &self.0 {
            None => now_ms(),
            Some(t) => *t.borrow(),
        }
    }

    /// Moves a manual clock to `at` (never back) and wakes whoever sleeps on it; the wall
    /// clock cannot be moved and ignores this.
    pub fn set(&self, at: Millis) {
        if let Some(t) = &self.0 {
            t.send_if_modified(|now| {
                let moved = at > *now;
                *now = (*now).max(at);
                moved
            });
        }
    }

    /// Moves a manual clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.set(self.now() + by.as_millis() as Millis);
    }

    /// Returns once the clock shows `at` or later.
    pub async fn sleep_until(&self, at: Millis) {
        match &self.0 {
            None => {
                let wait = (at - now_ms()).max(0) as u64;
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Some(t) => {
                let mut rx = t.subscribe();
                // The sender lives as long as this clock, so this only ends at `at`.
                let _ = rx.wait_for(|now| *now >= at).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_its_sleepers_when_moved_past_their_time() {
        let clock = Clock::manual(1_000);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(5_000).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(2));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "3 s is before its time");
        clock.set(5_000);
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woken at 5 s")
            .unwrap();
    }

    #[test]
    fn a_manual_clock_never_goes_back() {
        let clock = Clock::manual(1_000);
        clock.set(500);
        assert_eq!(clock.now(), 1_000);
        let twin = clock.clone();
        twin.set(2_000);
        assert_eq!(clock.now(), 2_000, "clones share one time");
    }

    #[tokio::test]
    async fn the_wall_clock_sleeps_in_real_time() {
        let clock = Clock::wall();
        let before = now_ms();
        clock.sleep_until(before + 20).await;
        assert!(now_ms() >= before + 20);
        clock.set(0);
        assert!(clock.now() >= before, "the wall clock cannot be moved");
    }
}
