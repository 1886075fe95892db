//! The retry schedule: how long to wait before the next attempt.

use std::time::Duration;

use super::attempt::AttemptResult;
use crate::config::{Config, RetryPolicyKind};
use crate::domain::Millis;

/// A retry policy with its cap and attempt budget.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub kind: Kind,
    pub max_delay: Duration,
    pub max_attempts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `base × (1 + ln n)²`: grows with the log of the attempt number, the original design.
    Log { base: Duration },
    /// `base × 2^(n-1)`.
    Exponential { base: Duration },
    /// The n-th delay of the list; the last one repeats.
    Fixed(Vec<Duration>),
}

/// Share of a delay that jitter may add or take away.
const JITTER: f64 = 0.10;

impl RetryPolicy {
    pub fn from_config(c: &Config) -> Self {
        let kind = match c.retry_policy {
            RetryPolicyKind::Log => Kind::Log { base: c.retry_base },
            RetryPolicyKind::Exponential => Kind::Exponential { base: c.retry_base },
            RetryPolicyKind::Fixed => Kind::Fixed(c.retry_fixed.clone()),
        };
        Self {
            kind,
            max_delay: c.retry_max_delay,
            max_attempts: c.retry_max_attempts,
        }
    }

    /// Delay before attempt `n + 1`, after `n ≥ 1` failed attempts, without jitter, capped.
    pub fn delay(&self, n: u32) -> Duration {
        let n = n.max(1);
        let d = match &self.kind {
            Kind::Log { base } => {
                let f = 1.0 + (n as f64).ln();
                base.mul_f64(f * f)
            }
            Kind::Exponential { base } => {
                let exp = (n - 1).min(40);
                base.checked_mul(1u32 << exp.min(31))
                    .and_then(|d| d.checked_mul(1u32 << exp.saturating_sub(31)))
                    .unwrap_or(Duration::MAX)
            }
            Kind::Fixed(list) => list
                .get((n - 1) as usize)
                .or(list.last())
                .copied()
                .unwrap_or_default(),
        };
        d.min(self.max_delay)
    }

    /// [`RetryPolicy::delay`] with ±10 % jitter from `unit` (a number in `[0, 1)`), still
    /// capped. Jitter keeps receivers that failed together from being retried together.
    pub fn jittered(&self, n: u32, unit: f64) -> Duration {
        let factor = 1.0 - JITTER + 2.0 * JITTER * unit.clamp(0.0, 1.0);
        self.delay(n).mul_f64(factor).min(self.max_delay)
    }

    /// The delay asked for by `Retry-After` (on 429 and 503), within the cap.
    pub fn retry_after(&self, asked: Duration) -> Duration {
        asked.min(self.max_delay)
    }
}

/// Parses a `Retry-After` value: delay seconds, or an HTTP date counted from `now` (the
/// clock's time when the answer came).
pub fn parse_retry_after(v: &str, now: Millis) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v)
        .ok()?
        .timestamp_millis();
    u64::try_from(at - now).ok().map(Duration::from_millis)
}

/// When a failed attempt goes again.
pub(super) enum RetryAt {
    /// After the retry policy's delay for its attempts, spread by this draw in `[0, 1)`
    /// (or what the receiver asked for with `Retry-After`).
    Jittered(f64),
    /// Then: a batch's heads go again together.
    At(Millis),
}

impl RetryPolicy {
    /// When a failed attempt, the `attempts`-th, answered `result`, is tried again: after
    /// the policy's delay spread by `jitter`, or what the receiver asked for with
    /// `Retry-After`.
    pub(super) fn retry_time(
        &self,
        attempts: u32,
        result: &AttemptResult,
        jitter: f64,
        now: Millis,
    ) -> Millis {
        let delay = match result.retry_after {
            Some(asked) => self.retry_after(asked),
            None => self.jittered(attempts, jitter),
        };
        now + delay.as_millis() as Millis
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(kind: Kind) -> RetryPolicy {
        RetryPolicy {
            kind,
            max_delay: Duration::from_secs(3600),
            max_attempts: 10,
        }
    }

    #[test]
    fn log_schedule_follows_the_formula_and_grows() {
        let p = policy(Kind::Log {
            base: Duration::from_secs(30),
        });
        assert_eq!(p.delay(1), Duration::from_secs(30));
        let d2 = p.delay(2).as_secs_f64();
        assert!((d2 - 30.0 * (1.0 + 2f64.ln()).powi(2)).abs() < 1e-6);
        let delays: Vec<Duration> = (1..10).map(|n| p.delay(n)).collect();
        assert!(delays.windows(2).all(|w| w[0] < w[1]), "{delays:?}");
        // The design's "about 28 minutes over 10 attempts": nine waits.
        let total: f64 = delays.iter().map(Duration::as_secs_f64).sum();
        assert!((25.0 * 60.0..32.0 * 60.0).contains(&total), "{total}");
    }

    #[test]
    fn exponential_doubles_and_is_capped() {
        let p = policy(Kind::Exponential {
            base: Duration::from_secs(1),
        });
        assert_eq!(p.delay(1), Duration::from_secs(1));
        assert_eq!(p.delay(2), Duration::from_secs(2));
        assert_eq!(p.delay(5), Duration::from_secs(16));
        assert_eq!(p.delay(13), Duration::from_secs(3600));
        assert_eq!(p.delay(500), Duration::from_secs(3600));
    }

    #[test]
    fn fixed_list_repeats_its_last_delay() {
        let p = policy(Kind::Fixed(vec![
            Duration::from_secs(1),
            Duration::from_secs(5),
        ]));
        assert_eq!(p.delay(1), Duration::from_secs(1));
        assert_eq!(p.delay(2), Duration::from_secs(5));
        assert_eq!(p.delay(9), Duration::from_secs(5));
    }

    #[test]
    fn jitter_stays_within_ten_percent_and_the_cap() {
        let p = policy(Kind::Log {
            base: Duration::from_secs(100),
        });
        assert_eq!(p.jittered(1, 0.0).as_millis(), 90_000);
        assert_eq!(p.jittered(1, 0.5).as_millis(), 100_000);
        assert!(p.jittered(1, 0.999) <= Duration::from_secs(110));
        assert_eq!(p.jittered(1000, 1.0), Duration::from_secs(3600));
    }

    #[test]
    fn retry_after_is_capped_and_parsed() {
        let p = policy(Kind::Log {
            base: Duration::from_secs(1),
        });
        assert_eq!(
            p.retry_after(Duration::from_secs(7200)),
            Duration::from_secs(3600)
        );
        let now = crate::domain::time::parse("2026-11-22T10:00:00Z").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 22 Nov 2026 10:01:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
