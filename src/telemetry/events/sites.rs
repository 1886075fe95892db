//! The rounds that decide sites and bring ended silences up to date.

use super::Emit;
use crate::domain::site::{SiteEvent, SiteTotals};
use crate::domain::{EventKind, Millis};
use crate::telemetry::families;

/// A site went down or came back.
pub struct SiteChanged<'a>(pub &'a SiteEvent);

impl Emit for SiteChanged<'_> {
    fn emit(self) {
        let e = self.0;
        match e.kind {
            EventKind::SiteConnectionLost => tracing::warn!(
                site_id = %e.site_id, sensors = e.sensors, lost = e.lost,
                "A site is down."
            ),
            _ => tracing::info!(
                site_id = %e.site_id, sensors = e.sensors, lost = e.lost,
                "A site is back."
            ),
        }
    }
}

/// A round's decision made notifications.
pub struct SitesDecided {
    pub notifications: usize,
}

impl Emit for SitesDecided {
    fn emit(self) {
        tracing::info!(notifications = self.notifications, "Sites decided.");
    }
}

/// A round could not decide; the next one tries again.
pub struct SitesDecideFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl Emit for SitesDecideFailed<'_> {
    fn emit(self) {
        tracing::warn!(error = %self.error, "Could not decide sites; trying again.");
    }
}

/// Silences that ended brought their clients up to date.
pub struct SilencesReconciled {
    pub notifications: usize,
}

impl Emit for SilencesReconciled {
    fn emit(self) {
        tracing::info!(
            notifications = self.notifications,
            "A silence ended: clients brought up to date."
        );
    }
}

pub struct SilencesReconcileFailed<'a> {
    pub error: &'a dyn std::fmt::Display,
}

impl Emit for SilencesReconcileFailed<'_> {
    fn emit(self) {
        tracing::warn!(error = %self.error, "Could not reconcile ended silences; trying again.");
    }
}

/// The whole store's alarms not resolved, counted for the gauges (the same on every node).
pub struct AlarmTotalsCounted {
    pub totals: crate::domain::alarm::AlarmTotals,
    pub now: Millis,
}

impl Emit for AlarmTotalsCounted {
    fn emit(self) {
        use crate::domain::alarm::AlarmKind;
        let t = &self.totals;
        for kind in AlarmKind::ALL {
            for (state, list) in [("open", &t.open), ("acknowledged", &t.acknowledged)] {
                let n = list.iter().find(|(k, _)| *k == kind).map_or(0, |(_, n)| *n);
                families::ALARMS_OPEN
                    .gauge_with(&[("kind", kind.as_str()), ("state", state)])
                    .set(n as f64);
            }
        }
        let oldest = t.oldest_unacknowledged.map_or(0, |o| (self.now - o).max(0));
        families::ALARM_OLDEST_UNACKNOWLEDGED_SECONDS
            .gauge()
            .set(oldest as f64 / 1000.0);
    }
}

/// The whole store's sites counted, for the gauges (the same on every node: a cluster's
/// dashboards take the maximum over its nodes, not the sum).
pub struct SiteTotalsCounted {
    pub totals: SiteTotals,
    pub now: Millis,
}

impl Emit for SiteTotalsCounted {
    fn emit(self) {
        let t = self.totals;
        families::SITES_DOWN.gauge().set(t.down as f64);
        families::SITE_HELD_EVENTS.gauge().set(t.held as f64);
        let oldest = t.oldest_grace.map_or(0, |p| (self.now - p).max(0));
        families::SITE_GRACE_OLDEST_SECONDS
            .gauge()
            .set(oldest as f64 / 1000.0);
    }
}
