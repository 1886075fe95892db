//! What every node does each second besides serving: decides the sites whose grace ran
//! out or that are down, and reconciles the silences that ended. The store lets one node
//! take each site and each silence, so running on every node decides each once, and a node
//! killed mid-round leaves it to the next round of another.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::delivery::Dispatcher;
use crate::domain::Millis;
use crate::domain::silence::SETTLE_MS;
use crate::domain::site::decide::Rules;
use crate::store::Store;

/// How often a node runs a round.
const EVERY: Duration = Duration::from_secs(1);

/// The sites' rules from the settings.
pub fn rules(config: &crate::config::Config) -> Rules {
    Rules {
        grace: config.site_grace.as_millis() as Millis,
        ratio: config.site_down_ratio,
        min_sensors: config.site_min_sensors,
    }
}

/// Runs a round every second of `clock` until `stop`, handing what each makes to
/// `dispatcher`.
pub async fn run(
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    clock: Clock,
    rules: Rules,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = clock.sleep_until(clock.now() + EVERY.as_millis() as Millis) => {}
        }
        // A call decides up to 500 due sites: while one makes notifications, more may wait.
        loop {
            match store.decide_sites(rules, clock.now()).await {
                Ok(made) if made.is_empty() => break,
                Ok(made) => {
                    tracing::info!(notifications = made.len(), "Sites decided.");
                    dispatcher.deliver(made);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Could not decide sites; trying again.");
                    break;
                }
            }
        }
        let now = clock.now();
        match store.reconcile_silences(now - SETTLE_MS, now).await {
            Ok(made) if made.is_empty() => {}
            Ok(made) => {
                tracing::info!(
                    notifications = made.len(),
                    "A silence ended: clients brought up to date."
                );
                dispatcher.deliver(made);
            }
            Err(e) => {
                tracing::warn!(error = %e, "Could not reconcile ended silences; trying again.")
            }
        }
    }
}
