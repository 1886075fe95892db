//! Requests sent with an `Idempotency-Key`: the key taken before the request runs and
//! settled with its answer after, in the store every node shares.

use super::{App, Result};
use crate::domain::{Millis, Reading, Rejection};
use crate::ingest::{Ingest, http::Idempotent};
use crate::store::{Taken, idempotency};

impl App {
    /// Takes `key` for a request with `fingerprint`: whether to run it, or what to answer.
    pub async fn take_key(&self, key: &str, fingerprint: String) -> Result<Taken> {
        Ok(idempotency::take(&*self.0.store, key, fingerprint, self.now()).await?)
    }

    /// Keeps the request's answer for its repeats, or (`None`) releases the key; a failure
    /// is only logged.
    pub async fn settle_key(&self, key: &str, answer: Option<(u16, String)>) {
        idempotency::settle(&*self.0.store, key, answer).await;
    }

    /// Submits readings under `key`: a repeat applies none of them twice.
    pub async fn submit_keyed(
        &self,
        ingest: &Ingest,
        key: &str,
        fingerprint: String,
        items: Vec<std::result::Result<Reading, Rejection>>,
        received_at: Millis,
    ) -> std::result::Result<Idempotent, crate::ingest::Error> {
        crate::ingest::http::submit_idempotent(
            ingest,
            &*self.0.store,
            key,
            fingerprint,
            items,
            received_at,
        )
        .await
    }
}
