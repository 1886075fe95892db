//! Where latch reads the time: the wall clock in service, a clock moved by hand in tests,
//! so liveness deadlines and retry delays are tested by moving time instead of sleeping.
//!
//! Everything that stamps or schedules (ingest's receive time, the engine's deadlines, the
//! dispatcher's due times, the API's retries) reads one shared `Clock`, so a moved clock
//! never leaves a part behind on the wall clock's time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use tokio::sync::watch;

use crate::domain::{Millis, time::now_ms};

/// A source of the current time. Cheap to clone; clones share one time.
///
/// It is also where decisions draw their random numbers (a retry's jitter, the ids latch
/// makes while delivering), so that a simulated clock makes a whole run repeatable from a
/// seed ([`Clock::simulated`]).
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    /// The wall clock.
    #[default]
    Wall,
    /// Moved by hand ([`Clock::set`]).
    Manual(Arc<watch::Sender<Millis>>),
    /// Tokio's clock, paused and advanced by the runtime when every task waits, counted
    /// from a start time; random numbers from a seeded generator.
    Simulated(Arc<Simulated>),
}

#[derive(Debug)]
struct Simulated {
    start: Millis,
    base: tokio::time::Instant,
    rng: Mutex<rand::rngs::StdRng>,
}

impl Clock {
    /// The wall clock.
    pub fn wall() -> Self {
        Self(Source::Wall)
    }

    /// A clock that shows `at` until [`Clock::set`] or [`Clock::advance`] moves it.
    pub fn manual(at: Millis) -> Self {
        Self(Source::Manual(Arc::new(watch::Sender::new(at))))
    }

    /// The simulation's clock: `start` when made, then Tokio's time (which a runtime with
    /// paused time advances whenever every task waits), so every sleep and timeout of the
    /// code under simulation runs on one virtual time; random numbers come from `seed`.
    /// Made inside the runtime it serves.
    pub fn simulated(start: Millis, seed: u64) -> Self {
        Self(Source::Simulated(Arc::new(Simulated {
            start,
            base: tokio::time::Instant::now(),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        })))
    }

    /// Whether this clock is moved by hand.
    pub fn is_manual(&self) -> bool {
        matches!(self.0, Source::Manual(_))
    }

    pub fn now(&self) -> Millis {
        match &self.0 {
            Source::Wall => now_ms(),
            Source::Manual(t) => *t.borrow(),
            Source::Simulated(s) => s.start + s.base.elapsed().as_millis() as Millis,
        }
    }

    /// Moves a manual clock to `at` (never back) and wakes whoever sleeps on it; other
    /// clocks cannot be moved and ignore this.
    pub fn set(&self, at: Millis) {
        if let Source::Manual(t) = &self.0 {
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
            Source::Wall => {
                let wait = (at - now_ms()).max(0) as u64;
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Source::Manual(t) => {
                let mut rx = t.subscribe();
                // The sender lives as long as this clock, so this only ends at `at`.
                let _ = rx.wait_for(|now| *now >= at).await;
            }
            Source::Simulated(s) => {
                let wait = (at - s.start).max(0) as u64;
                tokio::time::sleep_until(s.base + Duration::from_millis(wait)).await;
            }
        }
    }

    /// A number drawn uniformly from `[0, 1)`.
    pub fn random(&self) -> f64 {
        match &self.0 {
            Source::Simulated(s) => s.rng.lock().unwrap_or_else(|p| p.into_inner()).r#gen(),
            _ => rand::thread_rng().r#gen(),
        }
    }

    /// A new ULID at the clock's time, its random part drawn as [`Clock::random`] is.
    pub fn ulid(&self) -> ulid::Ulid {
        let random = match &self.0 {
            Source::Simulated(s) => {
                let mut rng = s.rng.lock().unwrap_or_else(|p| p.into_inner());
                (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64())
            }
            _ => rand::thread_rng().r#gen(),
        };
        ulid::Ulid::from_parts(self.now().max(0) as u64, random)
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

    #[tokio::test(start_paused = true)]
    async fn a_simulated_clock_follows_tokios_time_and_draws_from_its_seed() {
        let clock = Clock::simulated(1_000, 7);
        assert_eq!(clock.now(), 1_000);
        clock.sleep_until(61_000).await;
        assert_eq!(clock.now(), 61_000, "a minute of virtual time, at once");
        let twin = Clock::simulated(61_000, 7);
        let draws = |c: &Clock| (c.random(), c.ulid(), c.random());
        assert_eq!(draws(&clock), draws(&twin), "one seed, one sequence");
        assert_ne!(clock.random(), Clock::simulated(0, 8).random());
    }
}
