//! The backend itself: whether it answers, whether it is shared, and upkeep's retention:
//! `store/sqlite/retention.rs` and `store/postgres/retention.rs`. A round is one call
//! here, applied whole, where the backends delete in small steps with commits let through
//! between them; what it deletes is the same: readings and events older than the cut-off,
//! and finished notifications (with their attempts) last changed before it (not a state an
//! older state of its lane still waits behind, nor a delivered one an older failed one of its
//! lane that it outranks is stored behind), scanning the
//! outbox in order up to the first one made at the cut-off or later. (PostgreSQL drops
//! history a whole month at a time, so it keeps rows up to a month longer than asked; the
//! model deletes them row by row, as SQLite does.)

use async_trait::async_trait;

use latch::domain::{EventKind, Millis, Notification, Status, policy};
use latch::store::{Backend, Pruned, Result, Retention};

use super::node::NodeStore;
use super::tables::{Cx, Tables};

/// A node whose heartbeat is older than this is forgotten (`retention::expire_nodes`).
const FORGET_NODES_MS: Millis = 3_600_000;

impl Tables {
    pub(super) fn maintain(&mut self, cx: &Cx, keep: Retention) -> Pruned {
        let mut pruned = Pruned::default();
        if self.shared {
            let before = cx.now - FORGET_NODES_MS;
            self.cluster.nodes.retain(|_, n| n.heartbeat_at >= before);
        }
        if let Some(before) = keep.history_before {
            let (readings, events) = (self.readings.len(), self.events.len());
            self.readings.retain(|_, r| r.ts >= before);
            self.events.retain(|_, e| e.at >= before);
            pruned.readings = (readings - self.readings.len()) as u64;
            pruned.events = (events - self.events.len()) as u64;
        }
        if let Some(before) = keep.notifications_before {
            // Notifications are made in seq order: once one is that new, so are the rest.
            let doomed: Vec<i64> =
                self.notifications
                    .values()
                    .map(|r| &r.notification)
                    .take_while(|n| n.created_at < before)
                    .filter(|n| n.status != Status::Pending && n.updated_at < before)
                    .filter(|n| !self.kept_for_its_lane(n))
                    .filter(|n| {
                        // `KEPT_FOR_A_SILENCE`: its pair waits for a silence's end (a site
                        // event, any pair of its client's).
                        !self.silenced_pairs.keys().any(|(c, x)| {
                            *c == n.client_id && (*x == n.sensor_id || n.kind.is_site())
                        })
                    })
                    // `KEPT_FOR_ITS_ALARM`: an alarm not resolved tells its clients from them.
                    .filter(|n| {
                        !n.alarm_id.as_ref().is_some_and(|id| {
                            self.alarms.get(id).is_some_and(|a| {
                                a.state != latch::domain::alarm::AlarmState::Resolved
                            })
                        })
                    })
                    .map(|n| n.seq)
                    .collect();
            (pruned.notifications, pruned.attempts) = self.delete_notifications(cx, &doomed);
            pruned.audit = self.prune_trail(before, keep.audit_unshipped_kept);
        }
        pruned
    }

    /// A state `n` an older state of its lane still waits behind stays: the claim of that
    /// one supersedes it while `n` is stored (`KEPT_FOR_ITS_LANE` in the backends). So does
    /// a delivered `n` an older failed one of its lane that it outranks is stored behind: a
    /// retry of that one is refused only while `n` is (`KEPT_FOR_AN_OLDER_FAILED`).
    fn kept_for_its_lane(&self, n: &Notification) -> bool {
        self.lane_of(n).any(|o| {
            o.seq < n.seq
                && match o.status {
                    Status::Pending => {
                        n.kind == EventKind::StateChanged && o.kind == EventKind::StateChanged
                    }
                    Status::Failed => {
                        n.status == Status::Delivered
                            && policy::outranked_by(o.kind).contains(&n.kind)
                    }
                    _ => false,
                }
        })
    }
}

#[async_trait]
impl Backend for NodeStore {
    async fn ping(&self) -> Result<()> {
        self.run("ping", false, |_, _| Ok(())).await
    }

    /// One node at a time on a shared store: here every round is a whole call, so none is
    /// ever skipped.
    async fn maintain(&self, _now: Millis, retention: Retention) -> Result<Pruned> {
        self.run("maintain", true, |t, cx| Ok(t.maintain(cx, retention)))
            .await
    }
}
