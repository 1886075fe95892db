//! Clients registered, changed, deleted and enabled: the store first, then what the
//! dispatcher keeps of them (rate limits, batching, parked lanes).

use super::{App, Error, Result};
use crate::delivery::attempt::AttemptResult;
use crate::domain::client::effective_batch;
use crate::domain::{Client, Millis, SensorId};
use crate::telemetry::events::{ClientEnabled, Emit};

impl App {
    /// Registers `client` (stamped by the caller with [`App::now`]); the dispatcher paces
    /// and batches it from its first notification.
    pub async fn create_client(&self, client: &Client) -> Result<()> {
        self.check_escalation(client).await?;
        self.0.store.create_client(client.clone()).await?;
        self.follow_client(client);
        Ok(())
    }

    /// Replaces a client (`false`: no such client).
    pub async fn replace_client(&self, client: &Client) -> Result<bool> {
        self.check_escalation(client).await?;
        if !self.0.store.replace_client(client.clone()).await? {
            return Ok(false);
        }
        self.follow_client(client);
        Ok(true)
    }

    /// A client's escalation goes to a client that exists, and with every other
    /// client's makes neither a circle nor a chain past five. (Two changes at once on
    /// different nodes are each checked against the other's before; the round stops a
    /// chain at five levels whatever was set.)
    async fn check_escalation(&self, client: &Client) -> Result<()> {
        let Some(e) = &client.escalation else {
            return Ok(());
        };
        e.validate(Some(&client.id)).map_err(Error::Invalid)?;
        if self.0.store.get_client(e.to.clone()).await?.is_none() {
            return Err(Error::Invalid(format!(
                "escalation.to: no client {:?}",
                e.to
            )));
        }
        let mut chains = std::collections::HashMap::new();
        let mut page = crate::store::PageRequest {
            limit: 1000,
            after: None,
        };
        loop {
            let got = self.0.store.list_clients(page.clone(), None).await?;
            for c in &got.items {
                if let Some(e) = &c.escalation {
                    chains.insert(c.id.clone(), e.to.clone());
                }
            }
            match got.next {
                Some(after) => page.after = Some(after),
                None => break,
            }
        }
        chains.insert(client.id.clone(), e.to.clone());
        crate::domain::escalation::check_chains(&chains).map_err(Error::Invalid)
    }

    /// Deletes a client and its links; its pending notifications end cancelled (`false`:
    /// no such client).
    pub async fn delete_client(&self, id: String) -> Result<bool> {
        if !self.0.store.delete_client(id.clone(), self.now()).await? {
            return Ok(false);
        }
        // What is claimed but not yet sent goes back: nothing starts to it from here on.
        self.0.dispatcher.client_gone(&id);
        Ok(true)
    }

    /// Enables a client: its lanes parked while it was disabled go again, with its pending
    /// notifications as the store has them. The client as it is now (`None`: no such
    /// client).
    pub async fn enable_client(&self, id: String) -> Result<Option<Client>> {
        let Some(was_disabled) = self.0.store.enable_client(id.clone()).await? else {
            return Ok(None);
        };
        let pending = self.0.store.load_client_pending(id.clone()).await?;
        if was_disabled {
            ClientEnabled {
                client_id: &id,
                pending: pending.len(),
                now_disabled: self.0.store.count_disabled_clients().await.ok(),
            }
            .emit();
        }
        self.0.dispatcher.resume(&id, pending);
        Ok(self.0.store.get_client(id).await?)
    }

    /// What the dispatcher keeps of a client: its rate limit and its batching.
    fn follow_client(&self, client: &Client) {
        self.0
            .dispatcher
            .set_rate_limit(&client.id, client.rate_limit);
        self.0
            .dispatcher
            .set_batch(&client.id, effective_batch(client.batch, &client.url));
    }
}

impl App {
    /// Links a sensor to a client (idempotent): its next changes notify the client.
    pub async fn link(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        Ok(self.0.store.link(client_id, sensor_id, self.now()).await?)
    }

    /// Unlinks them (idempotent); pending notifications to the client about the sensor are
    /// cancelled at their next attempt.
    pub async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        Ok(self.0.store.unlink(client_id, sensor_id).await?)
    }

    /// Gives a client a new secret; the old one signs too for `grace` (`None`: no such
    /// client).
    pub async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        grace: Millis,
    ) -> Result<Option<Client>> {
        let until = self.now() + grace;
        Ok(self.0.store.rotate_secret(id, secret, until).await?)
    }

    /// Sends one signed `client.test` to `client` now and answers what happened.
    pub async fn test_client(&self, client: &Client) -> AttemptResult {
        self.0.dispatcher.test(client).await
    }
}
