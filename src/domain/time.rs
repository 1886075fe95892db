//! Time as latch keeps it: milliseconds since the Unix epoch, UTC.
//!
//! An `i64` of milliseconds is what every backend stores natively (SQLite INTEGER,
//! PostgreSQL BIGINT, ClickHouse UInt64), so values never change precision between layers.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};

/// Milliseconds since 1970-01-01T00:00:00Z.
pub type Millis = i64;

/// The wall clock, in milliseconds.
pub fn now_ms() -> Millis {
    Utc::now().timestamp_millis()
}

/// Formats as RFC 3339 UTC with milliseconds, e.g. `2026-11-22T10:00:00.123Z`.
pub fn format(ms: Millis) -> String {
    match Utc.timestamp_millis_opt(ms) {
        chrono::LocalResult::Single(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        _ => String::from("invalid"),
    }
}

/// Parses an RFC 3339 time with any offset.
pub fn parse(s: &str) -> Option<Millis> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Serde helpers that write `Millis` as RFC 3339 strings.
pub mod rfc3339 {
    use super::Millis;
    use serde::Serializer;

    pub fn serialize<S: Serializer>(ms: &Millis, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*ms))
    }

    pub mod option {
        use super::Millis;
        use serde::Serializer;

        pub fn serialize<S: Serializer>(ms: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
            match ms {
                Some(ms) => s.serialize_str(&crate::domain::time::format(*ms)),
                None => s.serialize_none(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_offsets() {
        let ms = parse("2026-11-22T10:00:00.123Z").unwrap();
        assert_eq!(format(ms), "2026-11-22T10:00:00.123Z");
        assert_eq!(parse("2026-11-22T13:00:00.123+03:00"), Some(ms));
        assert_eq!(parse("yesterday"), None);
        assert_eq!(parse("2026-11-22"), None);
    }
}
