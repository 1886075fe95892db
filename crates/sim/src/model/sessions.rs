//! Broker sessions' unacknowledged publishes: `mqtt_unacked` of both backends, kept per
//! session, replaced whole and taken once, by packet id.

use async_trait::async_trait;

use latch::store::{Result, Sessions, Unacked};

use super::node::NodeStore;

#[async_trait]
impl Sessions for NodeStore {
    async fn keep_unacked(&self, session: String, unacked: Vec<Unacked>) -> Result<()> {
        self.run("keep_unacked", true, |t, _| {
            let mut kept: Vec<Unacked> = unacked;
            kept.sort_by_key(|u| u.pkid);
            kept.dedup_by_key(|u| u.pkid);
            if kept.is_empty() {
                t.unacked.remove(&session);
            } else {
                t.unacked.insert(session, kept);
            }
            Ok(())
        })
        .await
    }

    async fn take_unacked(&self, session: String) -> Result<Vec<Unacked>> {
        self.run("take_unacked", true, |t, _| {
            Ok(t.unacked.remove(&session).unwrap_or_default())
        })
        .await
    }
}
