//! The recorder: writes attempts and verdicts to the store in batches, off the
//! dispatcher's loop, so a slow write never holds up sending.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::domain::{Millis, Outcome};
use crate::store::{Outbox, Registry};
use crate::telemetry::events::{ClientsDisabled, Emit, OutcomesAbandoned, OutcomesNotRecorded};

/// Most outcomes written in one store call.
const RECORD_BATCH_MAX: usize = 2048;

/// How long a stop keeps trying to record outcomes a failing store refused, within the
/// ten seconds past the grace that the stop waits for delivery's tasks.
const STOP_TRIES_FOR: Duration = Duration::from_secs(8);
/// The wait between those tries.
const STOP_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between tries of a write the store refused. An outcome has to land
/// before its claim's lease runs out (three delivery timeouts and 5 s), or another node
/// takes the notification up again and may end it otherwise (superseded, though the
/// receiver took it). With waits growing to 5 s, a store refusing half its calls for a
/// while let a delivered outcome miss its lease (simulation seed 1498); one try a second
/// costs a failing store little.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Writes attempts and verdicts in batches. A failed write is tried again (the outcomes
/// stay in memory); if latch dies first, the leases run out and the attempts are repeated,
/// which at-least-once delivery allows.
/// Once a batch is written, its notification ids go back to the dispatcher
/// ([`super::Cmd::Recorded`]): a head whose outcome this was may be claimed again.
pub(super) async fn recorder(
    store: Arc<dyn Outbox>,
    registry: Arc<dyn Registry>,
    mut rx: mpsc::UnboundedReceiver<Outcome>,
    clock: Clock,
    disable_after: Millis,
    written: mpsc::UnboundedSender<super::Cmd>,
) {
    let mut batch = Vec::new();
    // When the dispatcher stopped sending outcomes (a stop): tries end a bound after it.
    let mut closed_at: Option<tokio::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < RECORD_BATCH_MAX {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            match store
                .record(batch.clone(), clock.now(), disable_after)
                .await
            {
                Ok(disabled) => {
                    let ids = batch.iter().map(|o| o.notification_id.clone()).collect();
                    let _ = written.send(super::Cmd::Recorded(ids));
                    if !disabled.is_empty() {
                        ClientsDisabled {
                            disabled: &disabled,
                            now_disabled: registry.count_disabled_clients().await.ok(),
                        }
                        .emit();
                    }
                    break;
                }
                Err(e) => {
                    OutcomesNotRecorded {
                        error: &e,
                        outcomes: batch.len(),
                    }
                    .emit();
                    // At a stop, tries come often and end after a bound of their own: a store
                    // back within it still learns what the receivers answered.
                    if rx.is_closed() {
                        let since = *closed_at.get_or_insert_with(tokio::time::Instant::now);
                        if since.elapsed() >= STOP_TRIES_FOR {
                            OutcomesAbandoned {
                                outcomes: batch.len(),
                            }
                            .emit();
                            break;
                        }
                        backoff = backoff.min(STOP_BACKOFF);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        batch.clear();
    }
}
