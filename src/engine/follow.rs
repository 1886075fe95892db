//! On a shared store, the engine follows registry changes other nodes' APIs made: a sensor
//! created through node A is accepted by node B within a second, a deleted one refused,
//! a changed timeout applied.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::domain::Millis;
use crate::store::ClusterStore;

/// How often the change log is read.
const EVERY: Duration = Duration::from_secs(1);
/// How many reads back the watermark lies: a change committed by a transaction that began
/// before then may carry a lower seq than the newest one seen (changes apply idempotently).
const LOOKBACK: usize = 3;
/// How often, and how old, changes are pruned from the log.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
const KEEP_MS: i64 = 3_600_000;

/// Asks for a round now and waits until it is done: a node whose API changed a sensor of
/// a partition served here says so, and the sensor's next reading meets the change.
pub type Pokes = mpsc::Sender<oneshot::Sender<()>>;

/// Runs until `stop`, starting after registry change `seen`; `pokes` ask for a round now.
pub async fn run(
    store: Arc<dyn ClusterStore>,
    engine: Engine,
    seen: i64,
    mut pokes: mpsc::Receiver<oneshot::Sender<()>>,
    stop: CancellationToken,
) {
    let mut marks: VecDeque<i64> = VecDeque::from([seen]);
    let mut last_prune = engine.now();
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
            Some(poke) = pokes.recv() => waiting.push(poke),
        }
        while let Ok(poke) = pokes.try_recv() {
            waiting.push(poke);
        }
        let after = marks.front().copied().unwrap_or(seen);
        let (newest, changes) = match store.registry_changes(after).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Reading registry changes failed.");
                continue;
            }
        };
        for (id, now) in changes {
            let applied = match now {
                Some((_, state)) => engine.track(id, state).await,
                None => engine.remove_sensor(id).await,
            };
            if applied.is_err() {
                return; // The engine stopped.
            }
        }
        marks.push_back(newest.max(marks.back().copied().unwrap_or(seen)));
        if marks.len() > LOOKBACK {
            marks.pop_front();
        }
        let now = engine.now();
        if now - last_prune >= PRUNE_EVERY.as_millis() as Millis {
            last_prune = now;
            if let Err(e) = store.prune_registry_changes(now - KEEP_MS).await {
                tracing::warn!(error = %e, "Pruning registry changes failed.");
            }
        }
    }
}
