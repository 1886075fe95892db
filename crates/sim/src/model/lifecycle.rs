//! A client's lifecycle: secret rotation, the failure streak that disables it
//! (`policy::client_attempts`, `policy::disable_reason`), enabling it again: the
//! `lifecycle.rs` of both backends. Health is read in `tables.rs` (`Tables::health`).

use latch::domain::client::Disabled;
use latch::domain::{Client, Millis, Outcome, policy};

use super::tables::Tables;

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

    /// Keeps each client's running summary and failure streak from a batch of attempts,
    /// and disables the clients the policy says to, in the recording transaction
    /// (`lifecycle::note_attempts`).
    pub(super) fn note_attempts(
        &mut self,
        outcomes: &[Outcome],
        now: Millis,
        disable_after: Millis,
    ) -> Vec<Disabled> {
        let mut disabled = Vec::new();
        for c in policy::client_attempts(outcomes) {
            let Some(row) = self.clients.get_mut(&c.client_id) else {
                continue;
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
                continue;
            };
            // A disabled client's streak stays as it was (`WHERE disabled_at IS NULL`).
            if row.client.disabled_at.is_some() {
                continue;
            }
            row.failing_since = if c.succeeded {
                Some(failed_at)
            } else {
                row.failing_since.or(Some(failed_at))
            };
            if let Some(reason) =
                policy::disable_reason(c.gone, row.failing_since, now, disable_after)
            {
                row.client.disabled_at = Some(now);
                row.client.disabled_reason = Some(reason);
                disabled.push(Disabled {
                    client_id: c.client_id,
                    reason,
                });
            }
        }
        disabled
    }
}
