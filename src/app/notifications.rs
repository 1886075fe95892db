//! Failed notifications sent again: the store puts them back to pending, then the
//! dispatcher queues them in their lanes.

use super::{App, Result};
use crate::store::ReplayFilter;

impl App {
    /// Sends one failed notification again, with a fresh attempt budget.
    pub async fn retry_notification(&self, id: String) -> Result<()> {
        let r = self.0.store.retry_notification(id, self.now()).await?;
        self.0.dispatcher.deliver(vec![r]);
        Ok(())
    }

    /// Sends every failed notification `filter` matches again, in order per sensor;
    /// returns how many.
    pub async fn retry_notifications(&self, filter: ReplayFilter) -> Result<usize> {
        let refs = self.0.store.retry_notifications(filter, self.now()).await?;
        let retried = refs.len();
        self.0.dispatcher.deliver(refs);
        Ok(retried)
    }
}
