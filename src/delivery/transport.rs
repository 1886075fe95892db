//! Where attempts go out: the network in service ([`Network`]: webhooks over HTTP, broker
//! destinations through their links), or the simulated receivers of the simulation
//! (crates/sim), which run latch's real dispatcher against receivers that answer, hang,
//! fail or cut the connection on a virtual clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::attempt::AttemptResult;
use super::broker::Brokers;
use super::guard::Guard;
use super::sender::{self, Urls};
use crate::domain::{Millis, Sendable};

/// Makes attempts. Never fails: every problem is an attempt result.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// One attempt of one notification, begun at `at` (by latch's clock), bounded by
    /// `timeout`.
    async fn send(&self, s: &Sendable, timeout: Duration, at: Millis) -> AttemptResult;

    /// One request holding a batch of one client's notifications under batch `id`.
    async fn send_batch(
        &self,
        id: &str,
        sends: &[Box<Sendable>],
        timeout: Duration,
        at: Millis,
    ) -> AttemptResult;
}

/// The real thing: webhooks POSTed through the SSRF guard, broker destinations published.
pub struct Network {
    pub http: reqwest::Client,
    pub brokers: Brokers,
    pub guard: Arc<Guard>,
    /// Client URLs as parsed, and the HTTP clients of receivers with settings of their own.
    pub urls: Arc<Urls>,
}

#[async_trait]
impl Transport for Network {
    async fn send(&self, s: &Sendable, timeout: Duration, at: Millis) -> AttemptResult {
        sender::send(&self.brokers, &self.guard, &self.urls, s, timeout, at).await
    }

    async fn send_batch(
        &self,
        id: &str,
        sends: &[Box<Sendable>],
        timeout: Duration,
        at: Millis,
    ) -> AttemptResult {
        sender::send_batch(&self.guard, &self.urls, id, sends, timeout, at).await
    }
}

impl std::fmt::Debug for dyn Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transport(..)")
    }
}
