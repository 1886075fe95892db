//! Delivery's bookkeeping: outcomes recorded, clients disabled and enabled.

use super::Emit;
use crate::domain::client::Disabled;
use crate::telemetry::families;

/// A recorded batch of outcomes disabled clients (410 Gone, or failing too long).
pub struct ClientsDisabled<'a> {
    pub disabled: &'a [Disabled],
    /// Clients disabled now, all told (`None`: the count could not be read).
    pub now_disabled: Option<u64>,
}

impl Emit for ClientsDisabled<'_> {
    fn emit(self) {
        for d in self.disabled {
            tracing::warn!(client_id = %d.client_id, reason = d.reason.as_str(),
                "Disabled a client: no more attempts until it is enabled.");
        }
        if let Some(n) = self.now_disabled {
            families::CLIENTS_DISABLED.gauge().set(n as f64);
        }
    }
}

/// A disabled client enabled again: its parked lanes go with `pending` notifications.
pub struct ClientEnabled<'a> {
    pub client_id: &'a str,
    pub pending: usize,
    pub now_disabled: Option<u64>,
}

impl Emit for ClientEnabled<'_> {
    fn emit(self) {
        tracing::info!(client_id = %self.client_id, pending = self.pending, "Enabled a client.");
        if let Some(n) = self.now_disabled {
            families::CLIENTS_DISABLED.gauge().set(n as f64);
        }
    }
}

/// The store refused a batch of outcomes; they stay in memory and are tried again.
pub struct OutcomesNotRecorded<'a> {
    pub error: &'a dyn std::fmt::Display,
    pub outcomes: usize,
}

impl Emit for OutcomesNotRecorded<'_> {
    fn emit(self) {
        tracing::warn!(error = %self.error, outcomes = self.outcomes,
            "Recording delivery outcomes failed; retrying.");
    }
}

/// A stop gave up on outcomes the store kept refusing: their leases run out and the
/// attempts are made again.
pub struct OutcomesAbandoned {
    pub outcomes: usize,
}

impl Emit for OutcomesAbandoned {
    fn emit(self) {
        tracing::error!(
            outcomes = self.outcomes,
            "Giving up on recording outcomes at shutdown; they will be attempted again."
        );
    }
}
