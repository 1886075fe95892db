//! What every node does each second besides serving: decides the sites whose grace ran
//! out or that are down (telling the live stream of those that went down or came back),
//! reconciles the silences that ended, escalates the alarms nobody took, and counts the sites down for the gauges. The store
//! lets one node take each site and each silence, so running on every node decides each
//! once, and a node killed mid-round leaves it to the next round of another.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::delivery::Dispatcher;
use crate::domain::site::decide::Rules;
use crate::domain::{Live, Millis};
use crate::store::Store;
use crate::telemetry::events::{
    AlarmTotalsCounted, Emit, SilencesReconcileFailed, SilencesReconciled, SiteChanged,
    SiteTotalsCounted, SitesDecideFailed, SitesDecided,
};

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

/// What a round goes by: the sites' rules, and how long after a silence's end it is
/// reconciled (`silence::settle_ms`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub sites: Rules,
    pub settle: Millis,
}

impl Settings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            sites: rules(config),
            settle: crate::domain::silence::settle_ms(config.database_timeout),
        }
    }
}

/// Runs a round every second of `clock` until `stop`, handing what each makes to
/// `dispatcher`, each site's change to the live stream (`live`), and the sites' totals to
/// the gauges.
pub async fn run(
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    live: broadcast::Sender<Live>,
    clock: Clock,
    settings: Settings,
    stop: CancellationToken,
) {
    let rules = settings.sites;
    let every = EVERY.as_millis() as Millis;
    let mut next = clock.now() + every;
    loop {
        // Biased, so a simulated run picks the same branch every time (a stop at the
        // round's own instant ends it there).
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = clock.sleep_until(next) => {}
        }
        next = (next + every).max(clock.now());
        // A call decides the due sites (on SQLite up to 500, the first by grace): while a
        // call was full, more may wait. A few calls at most, so the silences and gauges
        // below come too; a site decided is not due again until something new comes for it.
        for _ in 0..CALLS_PER_ROUND {
            match store.decide_sites(rules, clock.now()).await {
                Ok(decided) => {
                    if decided.in_doubt {
                        dispatcher.look_for_pending(i64::MIN);
                    }
                    let more = decided.more;
                    for e in &decided.changed {
                        SiteChanged(e).emit();
                    }
                    if !decided.made.is_empty() {
                        SitesDecided {
                            notifications: decided.made.len(),
                        }
                        .emit();
                        dispatcher.deliver_served(decided.made);
                    }
                    for e in decided.changed {
                        // Only fails while nobody listens.
                        let _ = live.send(Live::Site(e));
                    }
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    SitesDecideFailed { error: &e }.emit();
                    made_in_doubt(&dispatcher, &e);
                    break;
                }
            }
        }
        let now = clock.now();
        match store.reconcile_silences(now - settings.settle, now).await {
            Ok(made) if made.is_empty() => {}
            Ok(made) => {
                SilencesReconciled {
                    notifications: made.len(),
                }
                .emit();
                dispatcher.deliver_served(made);
            }
            Err(e) => {
                SilencesReconcileFailed { error: &e }.emit();
                made_in_doubt(&dispatcher, &e);
            }
        }
        // Escalations due, and clients reached by one told of its alarm's resolution.
        match store.escalate(clock.now()).await {
            Ok(made) if made.is_empty() => {}
            Ok(made) => dispatcher.deliver_served(made),
            Err(e) => {
                tracing::warn!(error = %e, "The escalation round failed; the next one tries again.");
                made_in_doubt(&dispatcher, &e);
            }
        }
        match store.site_totals().await {
            Ok(totals) => SiteTotalsCounted {
                totals,
                now: clock.now(),
            }
            .emit(),
            Err(e) => tracing::debug!(error = %e, "Could not count the sites down."),
        }
        match store.alarm_totals().await {
            Ok(totals) => AlarmTotalsCounted {
                totals,
                now: clock.now(),
            }
            .emit(),
            Err(e) => tracing::debug!(error = %e, "Could not count the alarms."),
        }
    }
}

/// How many times a round asks the store to decide sites.
const CALLS_PER_ROUND: usize = 4;

/// A round whose answer was lost may have made notifications all the same: the
/// dispatcher looks for them now. Left to the next start (one node has no sweep), a lane's
/// newer notification went out first and the one the round made after it (simulation seed
/// 7662).
fn made_in_doubt(dispatcher: &Dispatcher, e: &crate::store::Error) {
    if e.maybe_written() {
        dispatcher.look_for_pending(i64::MIN);
    }
}
