//! What every node does each second besides serving: decides the sites whose grace ran
//! out or that are down, and reconciles the silences that ended. The store lets one node
//! take each site and each silence, so running on every node decides each once, and a node
//! killed mid-round leaves it to the next round of another.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{App, Result};
use crate::domain::Millis;
use crate::domain::site::decide::Rules;

/// How often a node runs a round.
const EVERY: Duration = Duration::from_secs(1);

impl App {
    /// Decides the sites due now, handing what that made to delivery.
    pub async fn decide_sites(&self, rules: Rules) -> Result<usize> {
        let made = self.store.decide_sites(rules, self.now()).await?;
        let n = made.len();
        self.dispatcher.deliver(made);
        Ok(n)
    }
}

/// The sites' rules from the settings.
pub fn rules(config: &crate::config::Config) -> Rules {
    Rules {
        grace: config.site_grace.as_millis() as Millis,
        ratio: config.site_down_ratio,
        min_sensors: config.site_min_sensors,
    }
}

/// Runs a round every second (of the engine's clock) until `stop`.
pub async fn run(app: App, rules: Rules, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = app.engine.clock().sleep_until(app.now() + EVERY.as_millis() as Millis) => {}
        }
        match app.decide_sites(rules).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(notifications = n, "Sites decided."),
            Err(e) => tracing::warn!(error = %e, "Could not decide sites; trying again."),
        }
        match app.reconcile_silences().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                notifications = n,
                "A silence ended: clients brought up to date."
            ),
            Err(e) => {
                tracing::warn!(error = %e, "Could not reconcile ended silences; trying again.")
            }
        }
    }
}
