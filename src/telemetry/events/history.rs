//! History shipped to ClickHouse.

use std::time::Duration;

use super::Emit;
use crate::telemetry::families;

/// A shipment ClickHouse took (`rows` may be 0: nothing was waiting).
pub struct Shipped {
    pub rows: usize,
    pub took: Duration,
}

impl Emit for Shipped {
    fn emit(self) {
        if self.rows > 0 {
            families::HISTORY_SHIPPED
                .counter()
                .increment(self.rows as u64);
            families::HISTORY_SHIP_SECONDS
                .histogram()
                .record(self.took.as_secs_f64());
        }
    }
}

/// Every row waiting was shipped; `failed_for` is how long shipping had been failing.
pub struct ClickHouseUp {
    pub failed_for: Option<Duration>,
}

impl Emit for ClickHouseUp {
    fn emit(self) {
        families::CLICKHOUSE_UP.gauge().set(1.0);
        if let Some(after) = self.failed_for {
            tracing::info!(?after, "ClickHouse is back; history ships again.");
        }
    }
}

/// ClickHouse did not take a shipment; `first` when it had been taking them until now.
pub struct ShipFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
    pub first: bool,
}

impl Emit for ShipFailed<'_> {
    fn emit(self) {
        families::CLICKHOUSE_UP.gauge().set(0.0);
        families::HISTORY_SHIP_FAILURES.counter().increment(1);
        if self.first {
            tracing::warn!(error = %self.error,
                "History cannot ship to ClickHouse; it waits in the spool, ingest goes on.");
        } else {
            tracing::debug!(error = %self.error, "History shipment failed again.");
        }
    }
}

/// Rows waiting in the store's spool, counted.
pub struct SpoolDepth(pub u64);

impl Emit for SpoolDepth {
    fn emit(self) {
        families::HISTORY_SPOOL_ROWS.gauge().set(self.0 as f64);
    }
}

/// What a retention round deleted past its time, by kind (`partitions`: ClickHouse's
/// monthly partitions dropped).
pub struct RetentionDeleted {
    pub readings: u64,
    pub events: u64,
    pub notifications: u64,
    pub attempts: u64,
    pub partitions: u64,
    pub audit: u64,
}

impl Emit for RetentionDeleted {
    fn emit(self) {
        let by = [
            ("readings", self.readings),
            ("events", self.events),
            ("notifications", self.notifications),
            ("attempts", self.attempts),
            ("partitions", self.partitions),
            ("audit", self.audit),
        ];
        for (what, n) in by {
            families::RETENTION_DELETED
                .counter_with(&[("what", what)])
                .increment(n);
        }
        if by.iter().any(|(_, n)| *n > 0) {
            tracing::debug!(
                readings = self.readings,
                events = self.events,
                notifications = self.notifications,
                attempts = self.attempts,
                partitions = self.partitions,
                audit = self.audit,
                "Retention deleted what was past its time."
            );
        }
    }
}
