//! Clients registered, changed, deleted and enabled: the store first, then what the
//! dispatcher keeps of them (rate limits, batching, parked lanes).

use super::{App, Result};
use crate::domain::Client;
use crate::domain::client::effective_batch;
use crate::telemetry::families;

impl App {
    /// Registers `client` (stamped by the caller with [`App::now`]); the dispatcher paces
    /// and batches it from its first notification.
    pub async fn create_client(&self, client: &Client) -> Result<()> {
        self.store.create_client(client.clone()).await?;
        self.follow_client(client);
        Ok(())
    }

    /// Replaces a client (`false`: no such client).
    pub async fn replace_client(&self, client: &Client) -> Result<bool> {
        if !self.store.replace_client(client.clone()).await? {
            return Ok(false);
        }
        self.follow_client(client);
        Ok(true)
    }

    /// Deletes a client and its links; its pending notifications end cancelled (`false`:
    /// no such client).
    pub async fn delete_client(&self, id: String) -> Result<bool> {
        if !self.store.delete_client(id.clone(), self.now()).await? {
            return Ok(false);
        }
        // What is claimed but not yet sent goes back: nothing starts to it from here on.
        self.dispatcher.client_gone(&id);
        Ok(true)
    }

    /// Enables a client: its lanes parked while it was disabled go again, with its pending
    /// notifications as the store has them. The client as it is now (`None`: no such
    /// client).
    pub async fn enable_client(&self, id: String) -> Result<Option<Client>> {
        let Some(was_disabled) = self.store.enable_client(id.clone()).await? else {
            return Ok(None);
        };
        let pending = self.store.load_client_pending(id.clone()).await?;
        if was_disabled {
            tracing::info!(client_id = %id, pending = pending.len(), "Enabled a client.");
            if let Ok(n) = self.store.count_disabled_clients().await {
                families::CLIENTS_DISABLED.gauge().set(n as f64);
            }
        }
        self.dispatcher.resume(&id, pending);
        Ok(self.store.get_client(id).await?)
    }

    /// What the dispatcher keeps of a client: its rate limit and its batching.
    fn follow_client(&self, client: &Client) {
        self.dispatcher
            .set_rate_limit(&client.id, client.rate_limit);
        self.dispatcher
            .set_batch(&client.id, effective_batch(client.batch, &client.url));
    }
}
