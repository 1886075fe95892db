//! The key clients' secrets are sealed under: `secret_key` of both backends. The model
//! keeps every secret as the API gave it (sealing is the backends' own concern, tested
//! beside them), so it only keeps which key the store says it seals under, recorded as a
//! keyed start records it.

use async_trait::async_trait;

use latch::store::{Result, Secrets};

use super::node::NodeStore;

/// The key id the model starts with, as a store is given one at its first keyed start.
pub const MODEL_KEY: &str = "model";

#[async_trait]
impl Secrets for NodeStore {
    async fn sealing_key(&self) -> Result<Option<String>> {
        self.run("sealing_key", false, |t, _| {
            Ok(Some(
                t.sealing_key.clone().unwrap_or_else(|| MODEL_KEY.into()),
            ))
        })
        .await
    }

    async fn set_sealing_key(&self, id: String) -> Result<()> {
        self.run("set_sealing_key", true, |t, _| {
            t.sealing_key = Some(id);
            Ok(())
        })
        .await
    }

    async fn first_sealing_key(&self, id: String) -> Result<String> {
        self.run("first_sealing_key", true, |t, _| {
            Ok(t.sealing_key.get_or_insert(id).clone())
        })
        .await
    }

    /// Nothing is sealed in the model, so nothing is to seal anew.
    async fn reseal(&self) -> Result<u64> {
        self.run("reseal", true, |_, _| Ok(0)).await
    }

    /// Nothing is sealed in the model, so no client's secret needs a key.
    async fn keys_in_use(&self) -> Result<Vec<String>> {
        self.run("keys_in_use", false, |_, _| Ok(Vec::new())).await
    }
}
