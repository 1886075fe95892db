//! A client's lifecycle: secret rotation, enabling it again, and recording's tables (the
//! attempts, the results, the failure streak), as the `lifecycle.rs` of both backends.
//! Health is read in `tables.rs` (`Tables::health`).

use std::collections::HashMap;

use latch::domain::client::DisabledReason;
use latch::domain::policy::ClientAttempts;
use latch::domain::{Attempt, Client, Millis, Outcome, Status};
use latch::store::Result;
use latch::store::rules::{self, record::Held, record::Recorded};

use super::tables::{AttemptRow, Cx, Tables};

impl Tables {
    /// The replaced secret keeps signing until `previous_until`.
    pub(super) fn rotate_secret(
        &mut self,
        id: &str,
        secret: String,
        previous_until: Millis,
    ) -> Option<Client> {
        let c = &mut self.clients.get_mut(id)?.client;
        c.previous_secret = Some(std::mem::replace(&mut c.secret, secret));
        c.previous_secret_until = Some(previous_until);
        Some(c.clone())
    }

    /// `None` if the client does not exist, else whether it was disabled.
    pub(super) fn enable_client(&mut self, id: &str) -> Option<bool> {
        let row = self.clients.get_mut(id)?;
        let was = row.client.disabled_at.is_some();
        row.client.disabled_at = None;
        row.client.disabled_reason = None;
        row.failing_since = None;
        Some(was)
    }
}

/// Recording's tables in the model ([`rules::record`]): the sequence and the disabling are
/// latch's own; these are the rows.
pub(super) struct OutcomeTables<'a> {
    pub t: &'a mut Tables,
    pub cx: &'a Cx,
}

impl rules::record::OutcomeTables for OutcomeTables<'_> {
    async fn held(&mut self, ids: &[&str], now: Millis) -> Result<(HashMap<String, Held>, Millis)> {
        let mut held = HashMap::with_capacity(ids.len());
        for id in ids {
            let Some(seq) = self.t.seq(id) else { continue };
            let r = &self.t.notifications[&seq];
            held.insert(
                id.to_string(),
                Held {
                    pending: r.notification.status == Status::Pending,
                    claimed_by: r.claimed_by.clone(),
                    lease_until: r.lease_until,
                    alarm: r.notification.alarm_id.is_some(),
                },
            );
        }
        Ok((held, now))
    }

    async fn start_escalations(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        for id in ids {
            self.t.start_escalation(id, now);
        }
        Ok(())
    }

    async fn insert_attempts(&mut self, attempted: &[&Outcome]) -> Result<()> {
        let t = &mut *self.t;
        for o in attempted {
            let Some(a) = &o.attempt else { continue };
            // Kept under the outcome's notification (the column the backends fill).
            let attempt = Attempt {
                notification_id: o.notification_id.clone(),
                ..a.clone()
            };
            t.next.attempt += 1;
            t.audit.attempted(&attempt);
            t.attempts.insert(
                t.next.attempt,
                AttemptRow {
                    id: t.next.attempt,
                    client_id: o.client_id.clone(),
                    attempt,
                },
            );
        }
        Ok(())
    }

    async fn write_results(&mut self, results: &[Recorded<'_>], now: Millis) -> Result<()> {
        for r in results {
            let Some(seq) = self.t.seq(r.id) else {
                continue;
            };
            self.t.set_status(self.cx, seq, r.status, now);
            let row = self.t.notifications.get_mut(&seq).expect("indexed");
            row.notification.attempts = r.attempts;
            row.notification.next_attempt_at = r.next_attempt_at;
            row.notification.batch_id = r.batch_id.map(str::to_string);
            row.claimed_by = None;
            row.lease_until = None;
        }
        Ok(())
    }

    async fn note_client(&mut self, c: &ClientAttempts) -> Result<Option<Millis>> {
        let Some(row) = self.t.clients.get_mut(&c.client_id) else {
            return Ok(None);
        };
        // `failures_since_success`: added to without a delivery in the batch, else the
        // failures after the last one.
        row.failures_since_success = match c.last_success_at {
            None => row.failures_since_success + c.failures_after,
            Some(_) => c.failures_after,
        };
        row.last_success_at = c.last_success_at.or(row.last_success_at);
        if let Some((at, error)) = &c.last_failure {
            row.last_failure_at = Some(*at);
            row.last_error = error.clone();
        }
        let Some(failed_at) = c.failing_since else {
            // Delivered last: the streak ends.
            row.failing_since = None;
            return Ok(None);
        };
        // A disabled client's streak stays as it was (`WHERE disabled_at IS NULL`).
        if row.client.disabled_at.is_some() {
            return Ok(None);
        }
        row.failing_since = if c.succeeded {
            Some(failed_at)
        } else {
            row.failing_since.or(Some(failed_at))
        };
        Ok(row.failing_since)
    }

    async fn disable_client(
        &mut self,
        client_id: &str,
        now: Millis,
        reason: DisabledReason,
    ) -> Result<()> {
        if let Some(row) = self.t.clients.get_mut(client_id) {
            row.client.disabled_at = Some(now);
            row.client.disabled_reason = Some(reason);
        }
        Ok(())
    }
}
