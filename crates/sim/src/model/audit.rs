//! What the store ever did, kept beside its tables for the simulation's invariants: each
//! notification's life (every status it went through, by which call of which node, and
//! every attempt recorded for it), and every reading and event committed. Retention, the
//! history spool and deletes take rows out of the tables; nothing leaves the audit.
//!
//! A notification that reached a final status (delivered, failed, superseded, cancelled)
//! keeps it: the one way out is a manual retry of a failed one (`retry_notification`,
//! `retry_notifications`). The audit records any other change out of a final status as a
//! [`Violation`] rather than panic inside a store call, so the harness reports it with
//! the seed and the trace.

use std::collections::BTreeMap;
use std::sync::Arc;

use latch::domain::{Attempt, Event, EventKind, Millis, Notification, SensorId, Status};
use latch::store::{ReadingRecord, Stored};

/// What a call runs with: the database's clock at the moment it is applied (the model's
/// [`latch::clock::Clock`]), and who made it, for the audit.
#[derive(Debug, Clone)]
pub(crate) struct Cx {
    /// "Database now": what the backends read from their own clock (`now()` on
    /// PostgreSQL, leases, heartbeats, rate grants, registry changes).
    pub now: Millis,
    pub node: Arc<str>,
    pub op: &'static str,
}

/// One change of a notification's status.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub from: Status,
    pub to: Status,
    /// The database's time when it was applied.
    pub at: Millis,
    /// The store call that made it (`commit`, `claim`, `record`, `delete_sensor`, …).
    pub op: &'static str,
    /// The node whose call it was.
    pub node: Arc<str>,
}

/// A notification's whole life as the store saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trail {
    pub id: String,
    pub seq: i64,
    pub client_id: String,
    pub sensor_id: SensorId,
    pub kind: EventKind,
    pub data: Option<bool>,
    /// A site's notification's own fields, as made (retention may delete the row).
    pub body: Option<String>,
    /// When its event happened.
    pub occurred_at: Millis,
    /// A reminder's number (`sensor.still_lost`, `sensor.state_held`'s reminders).
    pub reminder: Option<u32>,
    /// The alarm it names.
    pub alarm_id: Option<String>,
    pub created_at: Millis,
    /// When the commit that made it was applied, by the database's clock (a slow store
    /// applies a commit after the time its node stamped on it).
    pub made_at: Millis,
    /// The node whose commit made it.
    pub created_by: Arc<str>,
    /// Its status now (or when retention deleted it).
    pub status: Status,
    pub changes: Vec<Change>,
    /// Every attempt recorded for it, in the order recorded (a manual retry starts the
    /// count of `attempts` again; this keeps them all).
    pub attempts: Vec<Attempt>,
    /// When retention deleted it (finished, and old enough).
    pub deleted_at: Option<Millis>,
    /// Its row's `updated_at` (its last change, as the caller dated it) when retention
    /// deleted it: what retention judges its age by.
    pub deleted_updated_at: Option<Millis>,
    /// Each claim that leased it: when, and to which node.
    pub claims: Vec<(Millis, Arc<str>)>,
}

/// A notification that left a final status other than by a manual retry of a failed one.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub id: String,
    pub seq: i64,
    pub change: Change,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.change;
        write!(
            f,
            "notification {} (seq {}) went from {} to {} at {} by {} of node {}",
            self.id,
            self.seq,
            c.from.as_str(),
            c.to.as_str(),
            c.at,
            c.op,
            c.node
        )
    }
}

/// Whether `from` is a status a notification ends in.
pub fn is_final(status: Status) -> bool {
    status != Status::Pending
}

/// Whether a change of status leaves a final one other than by a manual retry of a failed
/// notification (the only way out the contract allows).
pub fn leaves_final(from: Status, to: Status, op: &str) -> bool {
    let retry = from == Status::Failed
        && to == Status::Pending
        && matches!(op, "retry_notification" | "retry_notifications");
    is_final(from) && from != to && !retry
}

/// The audit log. Read it through [`super::Tables::audit`].
#[derive(Debug, Default)]
pub struct Audit {
    trails: BTreeMap<i64, Trail>,
    seq_of: BTreeMap<String, i64>,
    violations: Vec<Violation>,
    /// Each client deletion that found its client: the client and when it committed.
    deleted_clients: Vec<(String, Millis)>,
    readings: Vec<Stored<ReadingRecord>>,
    events: Vec<Stored<Event>>,
    /// Which commit wrote each of `readings`, and each of `events`, and when.
    reading_commits: Vec<Committed>,
    event_commits: Vec<Committed>,
    /// Group commits applied so far.
    commits: u64,
    /// Each link made or removed through the API: when, the pair, and whether linked.
    links: Vec<(Millis, String, SensorId, bool)>,
}

/// Which group commit wrote a row (numbered from 1, in the order applied), and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub commit: u64,
    pub at: Millis,
    /// The node whose commit it was.
    pub node: Arc<str>,
}

impl Audit {
    pub(crate) fn created(&mut self, cx: &Cx, n: &Notification) {
        self.seq_of.insert(n.id.clone(), n.seq);
        self.trails.insert(
            n.seq,
            Trail {
                id: n.id.clone(),
                seq: n.seq,
                client_id: n.client_id.clone(),
                sensor_id: n.sensor_id,
                kind: n.kind,
                data: n.data,
                body: n.body.clone(),
                occurred_at: n.occurred_at,
                reminder: n.detail.reminder,
                alarm_id: n.alarm_id.clone(),
                created_at: n.created_at,
                made_at: cx.now,
                created_by: cx.node.clone(),
                status: n.status,
                changes: Vec::new(),
                attempts: Vec::new(),
                deleted_at: None,
                deleted_updated_at: None,
                claims: Vec::new(),
            },
        );
    }

    /// Notification `seq` names alarm `id` (written just after it was made).
    pub(crate) fn named(&mut self, seq: i64, id: &str) {
        if let Some(t) = self.trails.get_mut(&seq) {
            t.alarm_id = Some(id.to_string());
        }
    }

    pub(crate) fn changed(&mut self, cx: &Cx, id: &str, seq: i64, from: Status, to: Status) {
        let change = Change {
            from,
            to,
            at: cx.now,
            op: cx.op,
            node: cx.node.clone(),
        };
        if leaves_final(from, to, cx.op) {
            self.violations.push(Violation {
                id: id.to_string(),
                seq,
                change: change.clone(),
            });
        }
        if let Some(t) = self.trails.get_mut(&seq) {
            t.status = to;
            t.changes.push(change);
        }
    }

    /// An attempt recorded for a notification (the store keeps it even when the
    /// notification is gone; so does the audit, where it knew the notification).
    pub(crate) fn attempted(&mut self, attempt: &Attempt) {
        if let Some(t) = self
            .seq_of
            .get(&attempt.notification_id)
            .and_then(|seq| self.trails.get_mut(seq))
        {
            t.attempts.push(attempt.clone());
        }
    }

    /// A claim leased it to `cx.node`.
    pub(crate) fn claimed(&mut self, cx: &Cx, seq: i64) {
        if let Some(t) = self.trails.get_mut(&seq) {
            t.claims.push((cx.now, cx.node.clone()));
        }
    }

    /// A claim leased it with a new body (`ClaimStep::Retell`): what was sent says that.
    pub(crate) fn retold(&mut self, seq: i64, body: Option<String>) {
        if let Some(t) = self.trails.get_mut(&seq) {
            t.body = body;
        }
    }

    /// Client `id` was deleted (it existed).
    pub(crate) fn client_deleted(&mut self, cx: &Cx, id: &str) {
        self.deleted_clients.push((id.to_string(), cx.now));
    }

    pub(crate) fn deleted(&mut self, cx: &Cx, n: &Notification) {
        if let Some(t) = self.trails.get_mut(&n.seq) {
            t.deleted_at = Some(cx.now);
            t.deleted_updated_at = Some(n.updated_at);
        }
    }

    /// `client` was linked to `sensor` (or unlinked: `linked` false).
    pub(crate) fn linked(&mut self, cx: &Cx, client: &str, sensor: SensorId, linked: bool) {
        self.links
            .push((cx.now, client.to_string(), sensor, linked));
    }

    /// Whether `client` was linked to `sensor` at `at`, by the links made and removed
    /// through the API (the simulation makes every link that way).
    pub fn linked_at(&self, client: &str, sensor: SensorId, at: Millis) -> bool {
        self.links
            .iter()
            .rfind(|(when, c, s, _)| *when <= at && c == client && *s == sensor)
            .is_some_and(|l| l.3)
    }

    /// A group commit of `node` begins applying at `at`: what it writes is numbered with
    /// it.
    pub(crate) fn commit_begins(&mut self, at: Millis, node: Arc<str>) -> Committed {
        self.commits += 1;
        Committed {
            commit: self.commits,
            at,
            node,
        }
    }

    pub(crate) fn committed_reading(&mut self, id: i64, r: ReadingRecord, by: Committed) {
        self.readings.push(Stored { id, row: r });
        self.reading_commits.push(by);
    }

    pub(crate) fn committed_event(&mut self, id: i64, e: Event, by: Committed) {
        self.events.push(Stored { id, row: e });
        self.event_commits.push(by);
    }

    /// Every notification ever made, in outbox order.
    pub fn trails(&self) -> impl Iterator<Item = &Trail> {
        self.trails.values()
    }

    pub fn trail(&self, id: &str) -> Option<&Trail> {
        self.trails.get(self.seq_of.get(id)?)
    }

    /// When the last deletion of client `id` committed, if it was deleted.
    pub fn client_deleted_at(&self, id: &str) -> Option<Millis> {
        self.deleted_clients
            .iter()
            .rev()
            .find(|(c, _)| c == id)
            .map(|(_, at)| *at)
    }

    /// Every change out of a final status, in the order they happened.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Every reading committed (of a sensor registered at the time), in commit order.
    pub fn readings(&self) -> &[Stored<ReadingRecord>] {
        &self.readings
    }

    /// Every event committed, in commit order.
    pub fn events(&self) -> &[Stored<Event>] {
        &self.events
    }

    /// The commit of each of [`Audit::readings`], by index.
    pub fn reading_commits(&self) -> &[Committed] {
        &self.reading_commits
    }

    /// The commit of each of [`Audit::events`], by index.
    pub fn event_commits(&self) -> &[Committed] {
        &self.event_commits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_manual_retry_of_a_failed_one_leaves_a_final_status() {
        use Status::*;
        assert!(!leaves_final(Pending, Delivered, "record"));
        assert!(!leaves_final(Failed, Pending, "retry_notification"));
        assert!(!leaves_final(Failed, Pending, "retry_notifications"));
        assert!(leaves_final(Failed, Pending, "record"));
        assert!(leaves_final(Delivered, Superseded, "commit"));
        assert!(leaves_final(Superseded, Pending, "retry_notification"));
        assert!(leaves_final(Cancelled, Delivered, "record"));
        assert!(!leaves_final(Delivered, Delivered, "record"));
    }
}
