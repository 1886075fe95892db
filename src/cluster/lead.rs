//! Which node runs the broker sources (the plain AMQP queue, MQTT): the one holding
//! partition 0. They carry state from one holder to the next — what MQTT committed
//! without acknowledging is kept in the store at their stop and taken back at the next
//! start — so partition 0 is released only once they have stopped here: released first,
//! the next holder could start (and take what the store holds) before this node kept
//! what it left, and apply the broker's resends of it again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Held by the membership; the sources' task follows it ([`Lead::follower`]).
pub(super) struct Lead {
    /// Whether the sources are to run here.
    want: watch::Sender<bool>,
    /// Whether they run here, as their task last said.
    running: Arc<watch::Sender<bool>>,
}

/// The sources' end: what they are to do, and where they say what they do.
pub struct Follower {
    pub want: watch::Receiver<bool>,
    pub running: Arc<watch::Sender<bool>>,
}

impl Lead {
    pub(super) fn new() -> Self {
        Self {
            want: watch::channel(false).0,
            running: Arc::new(watch::channel(false).0),
        }
    }

    pub(super) fn follower(&self) -> Follower {
        Follower {
            want: self.want.subscribe(),
            running: self.running.clone(),
        }
    }

    /// Whether the sources are to run here (this node holds partition 0).
    pub(super) fn set(&self, now: bool) {
        self.want
            .send_if_modified(|want| std::mem::replace(want, now) != now);
    }

    /// Stops the sources here and waits, up to `bound`, until they have: `false` if they
    /// still run (a stop that hangs must not hold the partition for ever).
    pub(super) async fn stop_here(&self, bound: Duration) -> bool {
        self.set(false);
        let mut running = self.running.subscribe();
        tokio::time::timeout(bound, running.wait_for(|r| !*r))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partition 0 waits for the sources' stop: `stop_here` answers once their task says
    /// they stopped, not when it was asked to.
    #[tokio::test]
    async fn partition_zero_is_given_up_once_the_sources_stopped() {
        let lead = Lead::new();
        lead.set(true);
        let f = lead.follower();
        f.running.send_replace(true);
        let mut want = f.want.clone();
        let task = tokio::spawn(async move {
            want.wait_for(|w| !*w).await.unwrap();
            // Finishing and keeping what it holds takes a while.
            tokio::time::sleep(Duration::from_millis(200)).await;
            f.running.send_replace(false);
        });
        let at = tokio::time::Instant::now();
        assert!(lead.stop_here(Duration::from_secs(5)).await);
        assert!(at.elapsed() >= Duration::from_millis(200));
        task.await.unwrap();
        // Sources that never stop: the bound ends the wait.
        let lead = Lead::new();
        lead.follower().running.send_replace(true);
        assert!(!lead.stop_here(Duration::from_millis(50)).await);
    }
}
