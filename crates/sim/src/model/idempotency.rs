//! Idempotency keys: `idempotency.rs` of both backends, over the same rule.

use async_trait::async_trait;

use latch::domain::Millis;
use latch::store::idempotency::take_step;
use latch::store::{Idempotency, KeyRow, Result, Taken};

use super::node::NodeStore;

#[async_trait]
impl Idempotency for NodeStore {
    async fn take_key(
        &self,
        key: String,
        fingerprint: String,
        now: Millis,
        stale_before: Millis,
    ) -> Result<Taken> {
        self.run("take_key", true, |t, _| {
            let (row, _) = t.idempotency_keys.entry(key.clone()).or_insert((
                KeyRow {
                    fingerprint: fingerprint.clone(),
                    taken_at: 0,
                    answer: None,
                },
                now,
            ));
            if let Some(found) = take_step(row, &fingerprint, stale_before) {
                return Ok(found);
            }
            row.taken_at = now;
            let mut applied: Vec<u32> = t
                .idempotency_applied
                .iter()
                .filter(|(k, _, _)| *k == key)
                .flat_map(|(_, p, _)| p.iter().copied())
                .collect();
            applied.sort_unstable();
            applied.dedup();
            Ok(Taken::Fresh { applied })
        })
        .await
    }

    async fn answer_key(&self, key: String, answer: Option<(u16, String)>) -> Result<()> {
        self.run("answer_key", true, |t, _| {
            if let Some((row, _)) = t.idempotency_keys.get_mut(&key) {
                row.taken_at = 0;
                row.answer = answer;
            }
            Ok(())
        })
        .await
    }

    async fn forget_keys(&self, before: Millis) -> Result<u64> {
        self.run("forget_keys", true, |t, _| {
            let n = t.idempotency_keys.len();
            t.idempotency_keys.retain(|_, (_, at)| *at >= before);
            t.idempotency_applied.retain(|(_, _, at)| *at >= before);
            Ok((n - t.idempotency_keys.len()) as u64)
        })
        .await
    }
}
