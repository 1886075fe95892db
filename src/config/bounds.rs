//! The bounds of the settings that have them, declared once: [`Config`]'s validation checks
//! them and the book's settings reference prints them, so what the book says a setting
//! takes is what `latch serve` takes.

use std::time::Duration;

use super::{Config, MAX_DEBOUNCE};
use crate::domain::partition::MAX_PARTITIONS;

/// What values a setting takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// A duration longer than zero.
    AboveZero,
    /// A duration of at least this, when set.
    AtLeast(Duration),
    /// A duration of at most this.
    AtMost(Duration),
    /// A whole number from the first to the second, both included.
    Count(u64, u64),
    /// A share above 0 and at most 1.
    Share,
}

/// Every bounded setting, in the defaults' order.
pub const BOUNDS: &[(&str, Bound)] = &[
    ("database_timeout", Bound::AboveZero),
    ("clickhouse_flush", Bound::AboveZero),
    ("heartbeat_timeout", Bound::AboveZero),
    ("lost_reminder", Bound::AtLeast(Duration::from_secs(1))),
    ("debounce", Bound::AtMost(MAX_DEBOUNCE)),
    ("site_grace", Bound::AtMost(Duration::from_secs(3600))),
    ("site_down_ratio", Bound::Share),
    ("site_min_sensors", Bound::Count(1, 1_000_000)),
    ("retry_base", Bound::AboveZero),
    ("retry_max_delay", Bound::AboveZero),
    ("retry_max_attempts", Bound::Count(1, 1000)),
    ("delivery_timeout", Bound::AboveZero),
    ("delivery_concurrency", Bound::Count(1, 100_000)),
    ("delivery_client_concurrency", Bound::Count(1, 100_000)),
    ("engine_shards", Bound::Count(1, 256)),
    ("engine_batch_max", Bound::Count(1, 1_000_000)),
    ("endpoint_disable_after", Bound::AboveZero),
    ("cluster_lease", Bound::AtLeast(Duration::from_secs(1))),
    ("cluster_partitions", Bound::Count(1, MAX_PARTITIONS as u64)),
];

/// The bounds of `key`, if it has any.
pub fn bound_of(key: &str) -> Option<Bound> {
    BOUNDS.iter().find(|(k, _)| *k == key).map(|(_, b)| *b)
}

/// A setting's value as its bound judges it.
enum Value {
    Duration(Option<Duration>),
    Count(Option<u64>),
    Share(f64),
}

impl Bound {
    /// What it takes, as the book says it.
    pub fn describe(&self) -> String {
        match self {
            Bound::AboveZero => "longer than `0s`".into(),
            Bound::AtLeast(d) => format!("at least `{}`", text(*d)),
            Bound::AtMost(d) => format!("`0s` to `{}`", text(*d)),
            Bound::Count(lo, hi) => format!("`{lo}` to `{hi}`"),
            Bound::Share => "above `0`, at most `1`".into(),
        }
    }

    /// `Err` with the reason when `value` is out of bounds.
    fn check(&self, value: Value) -> Result<(), String> {
        match (self, value) {
            (Bound::AboveZero, Value::Duration(Some(d))) if d.is_zero() => {
                Err("must be longer than zero".into())
            }
            (Bound::AtLeast(min), Value::Duration(Some(d))) if d < *min => {
                Err(format!("must be at least {}", text(*min)))
            }
            (Bound::AtMost(max), Value::Duration(Some(d))) if d > *max => {
                Err(format!("must be at most {}", text(*max)))
            }
            (Bound::Count(lo, hi), Value::Count(Some(v))) if !(*lo..=*hi).contains(&v) => {
                Err(format!("{v} is not between {lo} and {hi}"))
            }
            (Bound::Share, Value::Share(v)) if !(v > 0.0 && v <= 1.0) => {
                Err(format!("{v} is not above 0 and at most 1"))
            }
            _ => Ok(()),
        }
    }
}

/// A duration as the settings write it: the largest whole unit.
fn text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

impl Config {
    /// Every bounded setting within its bounds; else the first that is not, named.
    pub(super) fn check_bounds(&self) -> Result<(), String> {
        for (key, bound) in BOUNDS {
            bound
                .check(self.bounded(key))
                .map_err(|why| format!("invalid setting `{key}`: {why}"))?;
        }
        Ok(())
    }

    /// The value of a setting [`BOUNDS`] names.
    fn bounded(&self, key: &str) -> Value {
        let d = |v: Duration| Value::Duration(Some(v));
        let n = |v: u32| Value::Count(Some(u64::from(v)));
        match key {
            "database_timeout" => d(self.database_timeout),
            "clickhouse_flush" => d(self.clickhouse_flush),
            "heartbeat_timeout" => d(self.heartbeat_timeout),
            "lost_reminder" => Value::Duration(self.lost_reminder),
            "debounce" => d(self.debounce),
            "site_grace" => d(self.site_grace),
            "site_down_ratio" => Value::Share(self.site_down_ratio),
            "site_min_sensors" => n(self.site_min_sensors),
            "retry_base" => d(self.retry_base),
            "retry_max_delay" => d(self.retry_max_delay),
            "retry_max_attempts" => n(self.retry_max_attempts),
            "delivery_timeout" => d(self.delivery_timeout),
            "delivery_concurrency" => n(self.delivery_concurrency),
            "delivery_client_concurrency" => n(self.delivery_client_concurrency),
            "engine_shards" => n(self.engine_shards),
            "engine_batch_max" => n(self.engine_batch_max),
            "endpoint_disable_after" => d(self.endpoint_disable_after),
            "cluster_lease" => Value::Duration(self.cluster_lease),
            "cluster_partitions" => Value::Count(self.cluster_partitions.map(u64::from)),
            other => unreachable!("BOUNDS names {other}, which bounded() does not read"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bounded_setting_is_declared_and_read() {
        let declared = super::super::declared::settings();
        let defaults = Config::load_from(None, &[]).unwrap();
        for (key, _) in BOUNDS {
            assert!(declared.contains(key), "{key} is not a setting");
            // Panics if `bounded` does not read it.
            let _ = defaults.bounded(key);
        }
    }

    #[test]
    fn bounds_are_described_as_settings_are_written() {
        assert_eq!(bound_of("site_grace").unwrap().describe(), "`0s` to `1h`");
        assert_eq!(bound_of("debounce").unwrap().describe(), "`0s` to `1d`");
        assert_eq!(
            bound_of("lost_reminder").unwrap().describe(),
            "at least `1s`"
        );
        assert_eq!(
            bound_of("engine_shards").unwrap().describe(),
            "`1` to `256`"
        );
        assert_eq!(bound_of("listen"), None);
    }
}
