//! What retention deletes in one upkeep round ([`super::Backend::maintain`]) and what it
//! did, shared by both backends.

use std::sync::LazyLock;

use crate::domain::{EventKind, Millis, Status, policy};

/// The cut-offs of one round, in the store's times (ms since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Readings (by `ts`) and sensor events (by `at`) before this are deleted. `None`:
    /// none, because they are kept forever or because the store only spools them for
    /// ClickHouse (which keeps its own).
    pub history_before: Option<Millis>,
    /// Finished notifications (delivered, failed, superseded, cancelled) last changed
    /// before this are deleted with their attempts; pending ones never are. `None`: none.
    pub notifications_before: Option<Millis>,
    /// Audit records not shipped to ClickHouse yet are kept past `notifications_before`
    /// (ClickHouse is set and keeps its own): none is lost while it is out of reach.
    pub audit_unshipped_kept: bool,
}

/// What one round deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub readings: u64,
    pub events: u64,
    pub notifications: u64,
    pub attempts: u64,
    /// Whole history partitions dropped (PostgreSQL), whose rows are not counted above.
    pub partitions: u64,
    /// Audit records, kept as long as notifications.
    pub audit: u64,
    /// Another node of the cluster was doing the upkeep: this one did nothing.
    pub skipped: bool,
}

impl Pruned {
    /// Adds another step's counts.
    pub fn add(&mut self, other: Pruned) {
        self.readings += other.readings;
        self.events += other.events;
        self.notifications += other.notifications;
        self.attempts += other.attempts;
        self.partitions += other.partitions;
        self.audit += other.audit;
    }

    pub fn is_empty(&self) -> bool {
        self.readings
            + self.events
            + self.notifications
            + self.attempts
            + self.partitions
            + self.audit
            == 0
    }
}

/// Retention keeps a delivered notification `n` while an older failed one of its lane
/// (same client and sensor) that it outranks ([`policy::outranked_by`]) is stored: SQL over
/// the row `n` a backend's delete names so, written here for both.
///
/// A manual retry of the failed one is refused only while such a newer one is stored
/// ([`policy::retry_refusal`], read from the outbox by the backends' `replay.rs`): nothing
/// else remembers that the client was told something newer. Deleting the newer one first
/// would let the older one be retried and tell the client an outdated state. So the newer
/// one waits for the older one, rather than the older one going with it: what keeps the
/// failed one (its own age, an alarm not resolved, a silence) is kept whole, and the newer
/// one goes at the same round or the next (a backend may read the lane as it was when its
/// step began). Only delivered ones count: the refusal reads a newer one pending or
/// delivered, and pending ones are never deleted.
pub(crate) static KEPT_FOR_AN_OLDER_FAILED: LazyLock<String> = LazyLock::new(|| {
    let quoted = |k: &EventKind| format!("'{}'", k.as_str());
    let arms: String = EventKind::ALL
        .iter()
        .filter(|k| !policy::outranked_by(**k).is_empty())
        .map(|k| {
            let by: Vec<String> = policy::outranked_by(*k).iter().map(quoted).collect();
            format!(" WHEN {} THEN n.kind IN ({})", quoted(k), by.join(", "))
        })
        .collect();
    format!(
        "(n.status = '{}' AND EXISTS (SELECT 1 FROM notifications o \
         WHERE o.sensor_id = n.sensor_id AND o.client_id = n.client_id AND o.seq < n.seq \
         AND o.status = '{}' AND CASE o.kind{arms} ELSE FALSE END))",
        Status::Delivered.as_str(),
        Status::Failed.as_str(),
    )
});

/// Notifications one pruning step reads, in outbox order. Each step holds the writer (on
/// SQLite, the only one) for the deletes it makes: a few hundred rows keep that to a few
/// milliseconds, which is all a commit waiting behind it waits.
pub(crate) const OUTBOX_STEP: i64 = 500;

/// History rows one pruning step deletes, at most.
pub(crate) const HISTORY_STEP: i64 = 2_000;

/// Sensors one history step looks at.
pub(crate) const SENSORS_STEP: i64 = 200;

/// One scanned notification: what decides whether retention deletes it.
#[derive(Debug, Clone)]
pub(crate) struct Scanned {
    pub seq: i64,
    pub created_at: Millis,
    pub pending: bool,
    pub updated_at: Millis,
}

/// Of a step's notifications (in seq order), those to delete, where the next step starts,
/// and whether the scan reached notifications created at `before` or later. Notifications
/// are numbered in the order they are made, so once one is that new, every later one is
/// too, and the scan ends there.
pub(crate) fn outbox_step(rows: &[Scanned], before: Millis, limit: i64) -> (Vec<i64>, i64, bool) {
    let mut doomed = Vec::new();
    let mut last = None;
    for r in rows {
        if r.created_at >= before {
            return (doomed, last.unwrap_or(r.seq - 1), true);
        }
        last = Some(r.seq);
        if !r.pending && r.updated_at < before {
            doomed.push(r.seq);
        }
    }
    let done = (rows.len() as i64) < limit;
    (doomed, last.unwrap_or(i64::MIN), done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, created_at: Millis, pending: bool, updated_at: Millis) -> Scanned {
        Scanned {
            seq,
            created_at,
            pending,
            updated_at,
        }
    }

    #[test]
    fn a_step_takes_the_old_finished_ones_and_stops_at_the_first_new_one() {
        let rows = [
            row(1, 10, false, 20),
            row(2, 10, true, 10),  // pending: never
            row(4, 20, false, 95), // finished after the cut-off
            row(5, 30, false, 40),
            row(7, 100, false, 100), // the first new one: the scan ends
            row(8, 50, false, 50),
        ];
        let (doomed, next, done) = outbox_step(&rows, 90, 10);
        assert_eq!(doomed, [1, 5]);
        assert_eq!(next, 5);
        assert!(done);
    }

    #[test]
    fn the_kept_for_a_failed_rule_lists_each_kind_that_outranks() {
        let sql = &*KEPT_FOR_AN_OLDER_FAILED;
        assert!(sql.contains(
            "WHEN 'sensor.connection_lost' THEN n.kind IN \
             ('sensor.connection_lost', 'sensor.connection_restored')"
        ));
        assert!(
            sql.contains("WHEN 'sensor.state_changed' THEN n.kind IN ('sensor.state_changed')")
        );
        // Outranked by nothing: never kept for.
        assert!(!sql.contains("WHEN 'alarm.acknowledged'"));
    }

    #[test]
    fn a_full_step_of_old_rows_goes_on_from_its_last() {
        let rows = [row(3, 10, false, 20), row(6, 10, true, 20)];
        let (doomed, next, done) = outbox_step(&rows, 90, 2);
        assert_eq!((doomed, next, done), (vec![3], 6, false));
        let (doomed, _, done) = outbox_step(&rows, 90, 3);
        assert!(done, "fewer than asked for: the outbox ends here");
        assert_eq!(doomed, [3]);
    }
}
