//! The service's own conditions: a task that panicked, a broker source paused, a request
//! refused for its credentials, a checkpoint of the write-ahead log.

use std::net::IpAddr;
use std::time::Duration;

use super::Emit;
use crate::telemetry::families;

/// A supervised task panicked: latch stops.
pub struct TaskPanicked<'a> {
    pub task: &'static str,
    pub panic: &'a str,
}

impl Emit for TaskPanicked<'_> {
    fn emit(self) {
        tracing::error!(task = self.task, panic = %self.panic, "A task panicked; latch stops.");
        families::TASK_PANICS.counter().increment(1);
    }
}

/// A broker source's session failed; it reconnects after `retry_in`.
pub struct SourcePaused<'a> {
    pub source: &'static str,
    /// The queue, exchange or topic.
    pub on: &'a str,
    pub error: &'a str,
    pub retry_in: Duration,
}

impl Emit for SourcePaused<'_> {
    fn emit(self) {
        tracing::warn!(source = %self.source, error = %self.error, retry_in = ?self.retry_in,
            on = self.on, "Broker ingest paused.");
        families::SOURCE_RECONNECTS
            .counter_with(&[("source", self.source)])
            .increment(1);
    }
}

/// MQTT ingest dropped its connection to get what it did not apply again: the session
/// stays on the broker, which resends every unacknowledged publish.
pub struct MqttReconnecting {
    pub retry_in: Duration,
}

impl Emit for MqttReconnecting {
    fn emit(self) {
        families::SOURCE_RECONNECTS
            .counter_with(&[("source", "mqtt")])
            .increment(1);
        tracing::warn!(retry_in = ?self.retry_in,
            "MQTT ingest reconnects to get unapplied readings again.");
    }
}

/// A request refused for its credentials (`reason`: `missing_token`, `unknown_token`,
/// `cluster_secret`), or unseen while its address failed too often (`throttled`, with no
/// peer logged: the throttle says so once per address).
pub struct AuthRefused {
    pub reason: &'static str,
    pub peer: Option<IpAddr>,
}

impl Emit for AuthRefused {
    fn emit(self) {
        families::AUTH_FAILURES
            .counter_with(&[("reason", self.reason)])
            .increment(1);
        if let Some(peer) = self.peer {
            tracing::debug!(%peer, reason = self.reason, "Refused an authentication.");
        }
    }
}

/// A checkpoint of the embedded store's write-ahead log: how long it took, or why it failed
/// (the next one, or the writer's backstop, tries again).
pub struct Checkpointed<'a> {
    pub outcome: Result<Duration, &'a dyn std::fmt::Display>,
}

impl Emit for Checkpointed<'_> {
    fn emit(self) {
        match self.outcome {
            Ok(took) => families::WAL_CHECKPOINT_SECONDS
                .histogram()
                .record(took.as_secs_f64()),
            Err(e) => tracing::warn!(error = %e, "Checkpointing the write-ahead log failed."),
        }
    }
}
