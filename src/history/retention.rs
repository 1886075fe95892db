//! Retention: the store's upkeep round, at least once a minute. Readings and events older
//! than `retention_readings`, finished notifications and their attempts older than
//! `retention_notifications`, go (zero keeps them); with ClickHouse the history is kept
//! there, and its monthly partitions past retention are dropped instead of the store's
//! spool rows (which leave the store once shipped anyway).
//!
//! The round also refreshes how far back history goes ([`super::History::history_from`]),
//! which costs a look-up per sensor and so is kept here rather than asked per request.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::History;
use super::clickhouse::ClickHouse;
use crate::clock::Clock;
use crate::config::Config;
use crate::domain::Millis;
use crate::store::{Backend, HistoryStore, Pruned, Retention, Store};
use crate::telemetry::events::{self, Emit};

/// How often a round runs, at most: a retention shorter than four of these is pruned more
/// often ([`Settings::every`]).
pub const EVERY: Duration = Duration::from_secs(60);

/// The shortest time between rounds, however short retention is.
const EVERY_AT_LEAST: Duration = Duration::from_secs(1);

/// How often the oldest reading is looked up again (at start, then at this pace).
const FROM_EVERY: Millis = 10 * 60 * 1000;

/// How long history and finished notifications are kept; `None`: forever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    pub readings: Option<Duration>,
    pub notifications: Option<Duration>,
}

impl Settings {
    pub fn from_config(config: &Config) -> Self {
        let keep = |d: Duration| (!d.is_zero()).then_some(d);
        Self {
            readings: keep(config.retention_readings),
            notifications: keep(config.retention_notifications),
        }
    }

    /// How often a round runs: every [`EVERY`], or every quarter of the shortest retention
    /// when that is shorter (at least [`EVERY_AT_LEAST`] apart). Rows live until the first
    /// round after they pass retention, so the store holds retention and one interval (and
    /// the round's own time): a minute's interval over a 20 s retention held four times
    /// what was asked, and each round had a minute of rows to delete while more came
    /// (`latch.db` 163 MB, then 197 MB after the next round, at ~19k readings/s; 61.5 MB
    /// from the first rounds on at every quarter of it, `latch bench retention`).
    pub fn every(&self) -> Duration {
        [self.readings, self.notifications]
            .into_iter()
            .flatten()
            .map(|d| d / 4)
            .fold(EVERY, Duration::min)
            .max(EVERY_AT_LEAST)
    }

    /// The cut-offs at `now`: history in the store only when it is kept there.
    fn at(&self, now: Millis, history_in_store: bool) -> Retention {
        let before = |d: Duration| now - d.as_millis() as Millis;
        Retention {
            history_before: self.readings.filter(|_| history_in_store).map(before),
            notifications_before: self.notifications.map(before),
            audit_unshipped_kept: !history_in_store,
        }
    }
}

/// Runs a round at start and every [`Settings::every`] of `clock` until `stop`.
pub async fn run(
    store: Arc<dyn Store>,
    clickhouse: Option<ClickHouse>,
    history: History,
    settings: Settings,
    clock: Clock,
    stop: CancellationToken,
) {
    let mut from_at = None;
    loop {
        let now = clock.now();
        round(&*store, clickhouse.as_ref(), settings, now).await;
        // Idempotency keys are kept a day, whatever the retention.
        if let Err(e) = store.forget_keys(now - crate::store::KEY_TTL_MS).await {
            tracing::warn!(error = %e, "Could not forget idempotency keys older than a day.");
        }
        if from_at.is_none_or(|at| now - at >= FROM_EVERY) {
            match oldest(&*store, clickhouse.as_ref()).await {
                Ok(from) => {
                    history.set_from(from);
                    from_at = Some(now);
                }
                Err(e) => tracing::warn!(error = %e, "Could not look up the oldest reading kept."),
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = clock.sleep_until(now + settings.every().as_millis() as Millis) => {}
        }
    }
}

/// One round: the store's upkeep with the cut-offs of `now`, and ClickHouse's partitions.
pub async fn round(
    store: &dyn Backend,
    clickhouse: Option<&ClickHouse>,
    settings: Settings,
    now: Millis,
) -> Pruned {
    let keep = settings.at(now, clickhouse.is_none());
    let mut pruned = match store.maintain(now, keep).await {
        Ok(p) => p,
        // The store told the start of the episode once; retention tries again next round.
        Err(e) if e.is_full() => {
            tracing::debug!(error = %e, "Retention could not delete: the disk is full.");
            Pruned::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "Store upkeep (retention) failed; it runs again within a minute.");
            Pruned::default()
        }
    };
    if let Some(ch) = clickhouse
        && !pruned.skipped
    {
        let before = |d: Option<Duration>| d.map(|d| now - d.as_millis() as Millis);
        let tables = [
            ("readings", before(settings.readings)),
            ("events", before(settings.readings)),
            ("notification_attempts", before(settings.notifications)),
            ("audit", before(settings.notifications)),
        ];
        for (table, cut) in tables {
            let Some(cut) = cut else { continue };
            match ch.drop_months_before(table, cut).await {
                Ok(n) => pruned.partitions += n,
                Err(e) => tracing::warn!(table, error = %e,
                    "Could not drop ClickHouse partitions past retention; trying again later."),
            }
        }
    }
    count(&pruned);
    pruned
}

fn count(p: &Pruned) {
    events::RetentionDeleted {
        readings: p.readings,
        events: p.events,
        notifications: p.notifications,
        attempts: p.attempts,
        partitions: p.partitions,
        audit: p.audit,
    }
    .emit();
}

/// The oldest reading kept, in the store (or its spool) and in ClickHouse.
async fn oldest(
    store: &dyn HistoryStore,
    clickhouse: Option<&ClickHouse>,
) -> Result<Option<Millis>, super::Error> {
    let mut from = store.history_from().await?;
    if let Some(ch) = clickhouse
        && let Some(shipped) = ch.oldest_reading().await?
    {
        from = Some(from.map_or(shipped, |f| f.min(shipped)));
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_keeps_forever_and_clickhouse_keeps_the_history() {
        let mut config = Config::load_from(None, &[]).unwrap();
        let s = Settings::from_config(&config);
        assert_eq!(s.readings, Some(Duration::from_secs(90 * 86_400)));
        assert_eq!(s.notifications, Some(Duration::from_secs(30 * 86_400)));
        let day = 86_400_000;
        let keep = s.at(100 * day, true);
        assert_eq!(keep.history_before, Some(10 * day));
        assert_eq!(keep.notifications_before, Some(70 * day));
        assert_eq!(s.at(100 * day, false).history_before, None);

        config.retention_readings = Duration::ZERO;
        let s = Settings::from_config(&config);
        assert_eq!(s.at(100 * day, true).history_before, None);
        assert_eq!(s.at(100 * day, true).notifications_before, Some(70 * day));
    }

    #[test]
    fn a_round_comes_every_minute_or_every_quarter_of_a_shorter_retention() {
        let secs = Duration::from_secs;
        let every = |readings: Option<u64>, notifications: Option<u64>| {
            Settings {
                readings: readings.map(secs),
                notifications: notifications.map(secs),
            }
            .every()
        };
        assert_eq!(every(Some(90 * 86_400), Some(30 * 86_400)), EVERY);
        assert_eq!(every(None, None), EVERY);
        assert_eq!(every(Some(20), Some(86_400)), secs(5));
        assert_eq!(every(None, Some(120)), secs(30));
        assert_eq!(every(Some(2), None), EVERY_AT_LEAST);
    }
}
