//! Replay: dead letters sent again, one or all of a client's, each judged by the policy
//! (`policy::retry_refusal` over `policy::outranked_by`): `replay.rs` of both backends.

use latch::domain::{Millis, Notification, NotificationRef, Status, policy};
use latch::store::{Error, ReplayFilter, Result};

use super::tables::{Cx, Tables};

impl Tables {
    /// Why `n` may not go back to pending: not failed, or a newer notification of its
    /// lane that outranks it is pending or delivered.
    fn refused(&self, n: &Notification) -> Option<Error> {
        let kinds = policy::outranked_by(n.kind);
        let newer = self.lane_of(n).any(|o| {
            o.seq > n.seq
                && kinds.contains(&o.kind)
                && matches!(o.status, Status::Pending | Status::Delivered)
        });
        policy::retry_refusal(n, newer).map(|r| Error::Conflict(r.to_string()))
    }

    /// Pending, due now, with a fresh attempt budget.
    fn back_to_pending(&mut self, cx: &Cx, seq: i64, now: Millis) {
        self.set_status(cx, seq, Status::Pending, now);
        if let Some(r) = self.notifications.get_mut(&seq) {
            r.notification.attempts = 0;
            r.notification.next_attempt_at = Some(now);
            r.notification.batch_id = None;
            r.claimed_by = None;
            r.lease_until = None;
        }
    }

    fn retried(n: &Notification, now: Millis) -> NotificationRef {
        NotificationRef {
            due_at: now,
            attempts: 0,
            batch_id: None,
            ..NotificationRef::of(n)
        }
    }

    pub(super) fn retry_notification(
        &mut self,
        cx: &Cx,
        id: &str,
        now: Millis,
    ) -> Result<NotificationRef> {
        let seq = self.seq(id).ok_or(Error::NotFound("notification"))?;
        let n = self.notifications[&seq].notification.clone();
        if let Some(e) = self.refused(&n) {
            return Err(e);
        }
        self.back_to_pending(cx, seq, now);
        Ok(Self::retried(&n, now))
    }

    /// Oldest first, each judged as a single retry would judge it once the older ones
    /// went back to pending; those refused are skipped.
    pub(super) fn retry_notifications(
        &mut self,
        cx: &Cx,
        f: &ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        if !self.clients.contains_key(&f.client_id) {
            return Err(Error::NotFound("client"));
        }
        let failed: Vec<Notification> = self
            .notifications
            .values()
            .map(|r| &r.notification)
            .filter(|n| {
                n.client_id == f.client_id
                    && n.status == Status::Failed
                    && f.sensor_id.is_none_or(|s| n.sensor_id == s)
                    && f.since.is_none_or(|since| n.created_at >= since)
            })
            .cloned()
            .collect();
        let mut out = Vec::new();
        for n in failed {
            if self.refused(&n).is_some() {
                continue;
            }
            self.back_to_pending(cx, n.seq, now);
            out.push(Self::retried(&n, now));
        }
        Ok(out)
    }
}
